"""The PostgreSQL store: one schema of one database, shared by engines on many hosts.

Its one job: ``store.PostgresStore``, the store protocol on a connection
pool (``connections``, with the one rule for a commit whose answer was lost),
running the transaction bodies (``memable._store.sql``) on it
(``transaction``), with its tables and migrations (``schema``), and the
LISTEN connection that hears what other engines did (``listener``). The only
package that imports ``psycopg`` and ``psycopg_pool``; ``import memable``
never imports it (the engine opens it by target, lazily).

May import: ``memable._store`` and the value modules.
"""
