"""The PostgreSQL store: one schema of one database, shared by engines on many hosts.

``store.PostgresStore`` runs the transaction bodies (``memable._store.sql``) through
``transaction`` on a connection pool (``connections``, with the one rule for a commit whose answer
was lost), with its tables and migrations (``schema``) and the LISTEN connection that hears other
engines (``listener``). The only package that imports ``psycopg`` and ``psycopg_pool``; the engine
opens it lazily, by target, so ``import memable`` does not.

May import: ``memable._store`` and the value modules."""
