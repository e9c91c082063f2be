"""How a store runs the shared SQL: one callable, and psycopg's parameter style.

The shared statements name their parameters ``:name``, which SQLite takes as
they are; ``pg`` writes them as psycopg's ``%(name)s``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

#: Runs one statement with named parameters in the caller's transaction; returns its
#: cursor.
Execute = Callable[[str, dict[str, Any]], Any]


def pg(sql: str) -> str:
    """``sql`` with ``:name`` parameters written as psycopg's ``%(name)s``.

    >>> pg("SELECT 1 WHERE a = :a AND b::text = :b")
    'SELECT 1 WHERE a = %(a)s AND b::text = %(b)s'
    """
    return re.sub(r"(?<!:):(\w+)", r"%(\1)s", sql)
