"""The command line: ``memable`` and its commands.

Its one job: the commands and their tables (``commands``), an engine run as a
worker process (``worker``) and the demo (``demo``). The others act on a store
through the store protocol, so every command works on every store.

May import: ``memable._engine`` and everything below it.
"""
