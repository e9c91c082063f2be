"""The engine's background threads: one loop shape, written once.

Its one job: named daemon threads that look, then wait (``loop.LoopThread``):
the timer thread (``timers``: due timers, the lease, the poll), the queue
thread (``queues``: claims what the consumed queues let start) and the
retention thread (``retention``: purges finished instances). They know nothing
of the engine; the runner starts, kicks and joins them.

May import: ``memable._store`` and the value modules.
"""
