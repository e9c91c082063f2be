"""Each operation a store offers, one transaction body written once, with its SQL.

A body is a function of a ``memable._store.transaction.Transaction``, which both stores run in
their own transaction; one module per concern (``instances``, ``claims``, ``steps``,
``suspensions``, ``signals``, ``timers``, ``cancel``, ``queues``, ``children``, ``forks``,
``schedules``, ``retention``, ``owners``, ``reads``).

May import: ``memable._store`` and the value modules."""
