"""The command line: ``memable`` and its commands.

Its one job: the commands and their tables (``commands``), an engine run as a worker
(``worker``) and the demo (``demo``); the others act through the store protocol, on any store.

May import: ``memable._engine`` and everything below it."""
