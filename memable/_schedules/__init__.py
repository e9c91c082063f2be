"""Schedules: cron ticks that run exactly once across every engine.

Its one job: a cron expression in a zone and its ticks (``cron``, the one
adapter over ``cronsim``), a schedule as declared and checked (``spec``),
and the firing of an engine's schedules at each look of the timer thread
(``scheduler``: the runner knows it only as a ticker). Each tick is an
instance with an idempotent id; firing compares and sets the schedule's last
tick in the transaction that creates it.

May import: ``memable._run``, ``memable._store`` and the value modules (and
``cronsim``); the engine declares schedules through it.
"""
