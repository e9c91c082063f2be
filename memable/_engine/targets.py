"""Which store a target names, and opening it: a SQLite file (or memory) or PostgreSQL.

``postgresql://`` or ``postgres://`` is PostgreSQL (psycopg imported only then); ``sqlite:``
URLs are spelled as SQLAlchemy does; any other scheme creates nothing.
"""

from __future__ import annotations

import difflib
import os
import re

from .._errors import StorageError
from .._postgres.schema import check_schema_name, is_url
from .._store.protocol import Store, Synchronous

#: Where a PostgreSQL store keeps its tables unless told.
DEFAULT_SCHEMA = "memable"

#: A URL's scheme at the start of a target (RFC 3986), and what follows it.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(.*)", re.DOTALL)
#: The schemes a target may start with, as the refusals name them.
ACCEPTED = ("a SQLite file's path, sqlite:///relative/path, sqlite:////absolute/path, "
            "sqlite:// (memory), or a postgresql:// or postgres:// URL")


def resolve_target(target: str | os.PathLike[str]) -> str | os.PathLike[str] | None:
    """The SQLite path (None: memory) or PostgreSQL URL ``target`` names; ``StorageError`` for
    a scheme memable does not open (never naming the rest: it may hold a password).

    >>> resolve_target("sqlite:///var/app.db"), resolve_target("sqlite:////srv/app.db")
    ('var/app.db', '/srv/app.db')
    >>> resolve_target("sqlite://") is None, resolve_target(r"C:\\data\\app.db")
    (True, 'C:\\\\data\\\\app.db')
    >>> resolve_target("mysql://app:secret@db/app")
    Traceback (most recent call last):
    ...
    memable._errors.StorageError: 'mysql:' is not a store memable opens: a store is ...
    """
    if not isinstance(target, str) or is_url(target):
        return target
    found = _SCHEME.match(target)
    if found is None or len(found[1]) == 1:  # a path, or a Windows drive letter
        return target
    scheme, rest = found[1], found[2]
    if scheme.lower() == "sqlite":
        return _sqlite_path(target, rest)
    close = difflib.get_close_matches(scheme.lower(), ["sqlite", "postgresql", "postgres"], n=1)
    hint = f"; did you mean {close[0] + ':'!r}?" if close else ""
    if not rest.startswith("//"):  # perhaps a file named so
        hint += " (a file whose name has ':' in it: write ./ before it)"
    raise StorageError(
        f"{scheme + ':'!r} is not a store memable opens: a store is {ACCEPTED}{hint}")


def _sqlite_path(target: str, rest: str) -> str | None:
    """The path of a ``sqlite:`` URL (``rest`` follows the colon); None for memory."""
    if rest in ("//", "///:memory:"):
        return None
    if rest.startswith("///") and len(rest) > 3 and "?" not in rest:
        return rest[3:]
    named = "a sqlite: URL with a user" if "@" in target else repr(target)
    raise StorageError(
        f"{named} is not a SQLite URL memable reads: write sqlite:///relative/path, "
        "sqlite:////absolute/path or sqlite:// (memory), with no host and no ?options, "
        "or the file's path alone"
    )


def check_target(target: object, schema: object) -> None:
    """Refuse, before any I/O, a target that is neither a path nor a URL, or a misplaced schema.

    >>> check_target("app.db", "jobs")
    Traceback (most recent call last):
    ...
    ValueError: schema is for a PostgreSQL URL; 'app.db' is a SQLite file
    """
    if not isinstance(target, (str, os.PathLike)):
        raise TypeError(f"a store is a path or a postgresql:// URL, not {target!r}")
    resolve_target(target)
    if schema is not None:
        if not is_url(target):
            raise ValueError(f"schema is for a PostgreSQL URL; {target!r} is a SQLite file")
        check_schema_name(schema)


def open_store(target: str | os.PathLike[str] | None, synchronous: Synchronous, *,
               schema: str | None = None, create: bool = True, pool_size: int = 10) -> Store:
    """Open the store ``target`` names (None, or ``sqlite://``: SQLite in memory)."""
    if target is not None:
        check_target(target, schema)
        target = resolve_target(target)
    if target is not None and is_url(target):
        try:
            from .._postgres.store import PostgresStore
        except ImportError as exc:
            raise StorageError(
                "a PostgreSQL store needs psycopg, in the extra 'postgres': pip install "
                "'memable-engine[postgres]', or from a checkout pip install '.[postgres]' "
                f"({exc})"
            ) from None
        return PostgresStore(str(target), synchronous, schema=schema or DEFAULT_SCHEMA,
                             create=create, pool_size=pool_size)
    from .._sqlite.store import SQLiteStore

    return SQLiteStore(target, synchronous, create=create)
