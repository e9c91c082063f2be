"""Each operation a store offers, one transaction body written once, with its SQL.

A body is a function of a ``memable._store.transaction.Transaction``: both
stores run it in their own transaction. Instances and their keys
(``instances``: new rows, waiting rows, readiness, a run's end, timeouts),
how an instance is created and claimed (``claims``), a run's steps
(``steps``), its suspension (``suspensions``), signals (``signals``),
timers (``timers``), cancels (``cancel``), queues (``queues``), children
(``children``), forks (``forks``), schedules (``schedules``), retention
(``retention``), owners and leases (``owners``) and the reads an operator
makes (``reads``).

May import: ``memable._store`` and the value modules.
"""
