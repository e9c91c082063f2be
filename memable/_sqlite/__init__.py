"""The SQLite store: one file (or memory) on one host.

``store.SQLiteStore``: the store protocol on one connection behind one lock. The only
package importing ``sqlite3`` and ``sqlite_utils``.

May import: ``memable._store`` and the value modules.
"""
