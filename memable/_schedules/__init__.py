"""Schedules: cron ticks that run exactly once across every engine.

Its one job: a cron expression in a zone and its ticks (``cron``), a schedule as declared
(``spec``), and firing an engine's schedules at each look of the timer thread
(``scheduler``). Each tick is an instance with an idempotent id, created in the transaction
that compares and sets the schedule's last tick.

May import: ``memable._run``, ``memable._store``, the value modules and ``cronsim``."""
