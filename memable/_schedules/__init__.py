"""Schedules: cron ticks that run exactly once across every engine.

Its one job: a cron expression in a zone and its ticks (``cron``, the one
adapter over ``cronsim``), a schedule as declared (``spec``), and firing an
engine's schedules at each look of the timer thread (``scheduler``). Each tick
is an instance with an idempotent id, created in the transaction that compares
and sets the schedule's last tick.

May import: ``memable._run``, ``memable._store`` and the value modules (and
``cronsim``); the engine declares schedules through it.
"""
