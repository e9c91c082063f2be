"""The SQLite store: one file (or memory) on one host.

Its one job: ``store.SQLiteStore``, the store protocol on one SQLite
connection behind one lock, running the transaction bodies
(``memable._store.sql``) on it (``transaction``), with its tables and
migrations (``schema``), the group commit every write goes through
(``group_commit``), and the watch that lets a run skip its per-step read
while nothing can have changed its instance (``watch``). The only package
that imports ``sqlite3`` and ``sqlite_utils``.

May import: ``memable._store`` and the value modules.
"""
