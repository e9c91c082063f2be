"""Which store a target names, and opening it: a SQLite file (or memory) or PostgreSQL.

A ``postgresql://`` or ``postgres://`` URL is a PostgreSQL store (its module,
and psycopg, are imported only then); anything else is a SQLite path.
"""

from __future__ import annotations

import os

from .._errors import StorageError
from .._postgres.schema import check_schema_name, is_url
from .._store.protocol import Store, Synchronous

#: Where a PostgreSQL store keeps its tables unless told.
DEFAULT_SCHEMA = "memable"


def check_target(target: object, schema: object) -> None:
    """Refuse, before any I/O, a target that is neither a path nor a URL, or a misplaced schema.

    >>> check_target("app.db", "jobs")
    Traceback (most recent call last):
    ...
    ValueError: schema is for a PostgreSQL URL; 'app.db' is a SQLite file
    """
    if not isinstance(target, (str, os.PathLike)):
        raise TypeError(f"a store is a path or a postgresql:// URL, not {target!r}")
    if schema is not None:
        if not is_url(target):
            raise ValueError(f"schema is for a PostgreSQL URL; {target!r} is a SQLite file")
        check_schema_name(schema)


def open_store(
    target: str | os.PathLike[str] | None,
    synchronous: Synchronous,
    *,
    schema: str | None = None,
    create: bool = True,
    pool_size: int = 10,
) -> Store:
    """Open the store ``target`` names (None: SQLite in memory)."""
    if target is not None:
        check_target(target, schema)
    if target is not None and is_url(target):
        try:
            from .._postgres.store import PostgresStore
        except ImportError as exc:
            raise StorageError(
                "a PostgreSQL store needs psycopg, in the extra 'postgres': pip install "
                "'memable-engine[postgres]', or from a checkout pip install '.[postgres]' "
                f"({exc})"
            ) from None
        return PostgresStore(
            str(target), synchronous, schema=schema or DEFAULT_SCHEMA, create=create,
            pool_size=pool_size,
        )
    from .._sqlite.store import SQLiteStore

    return SQLiteStore(target, synchronous, create=create)
