"""The PostgreSQL store: one schema of one database, shared by engines on many hosts.

Its one job: ``store.PostgresStore``, the store protocol on a connection
pool (``connections``), with its SQL (``sql``), its tables and migrations
(``schema``), and the LISTEN connection that hears what other engines did
(``listener``). The only package that imports ``psycopg`` and
``psycopg_pool``; ``import memable`` never imports it (the engine opens it by
target, lazily).

May import: ``memable._store`` and the value modules.
"""
