"""The command line: ``memable`` and its commands.

Its one job: the commands (``commands``: list, show, schedules, signal,
cancel, resume, purge, worker, demo), ``show``/``list``/``schedules`` reading
and formatting (``inspect``),
running an engine as a worker process (``worker``) and the demo (``demo``).
It talks to a store through the store protocol, so every command works on
every store.

May import: ``memable._engine`` and everything below it.
"""
