"""The SQL both stores run, written once with ``:name`` parameters.

Instances and their keys (``instances``: new rows, waiting rows, readiness),
how an instance is created and claimed (``claims``), a run's suspension
(``suspensions``), signals (``signals``), timers (``timers``), queues
(``queues``), children (``children``, with ``pg``, which rewrites ``:name``
parameters for PostgreSQL) and the reads an operator makes (``reads``).
Text and row conversions only: the stores execute it.

May import: ``memable._store`` and the value modules.
"""
