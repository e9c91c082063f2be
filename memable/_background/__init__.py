"""The engine's background threads: one loop shape, written once.

Its one job: named daemon threads that look, then wait on a condition with
a deadline, with a clock they are given (``loop.LoopThread``). The timer
thread (``timers``: due timers, the lease, the poll) calls one function the
runner hands it; the queue thread (``queues``) claims what the consumed
queues let start and hands it to the runner; the retention thread
(``retention``) purges finished instances past the engine's ``retention``, in
batches. They know nothing of the engine; the runner starts, kicks and joins
them.

May import: ``memable._store`` and the value modules.
"""
