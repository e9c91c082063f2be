"""The engine's background threads: named daemons that look, then wait (``loop.LoopThread``).

``timers`` (due timers, the lease, the poll), ``queues`` (claims what the consumed queues let
start), ``retention`` (purges finished instances). The runner starts, kicks and joins them.

May import: ``memable._store`` and the value modules.
"""
