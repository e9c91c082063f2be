"""Running instances: from a submitted run to its recorded end.

Its one job: ``runner.Runner``, the lifecycle, composed of the registry
(``registry``: what the engine runs, the phase, and the one lock), the runs
in flight (``runs``: the active runs, the worker pool, each run to its
recorded end) and the claims and recovery (``claims``: wake-ups, queue
claims, the poll's look, the lease); one run of an instance (``run``), what
a workflow sees (``context.Context``, with the step builder ``step``,
attempts with timeouts and retries ``attempts``, fan-out ``fan_out`` and
children ``children``), what a caller holds (``invocation.Invocation``), the
control-flow exceptions of a run (``control``), a registered workflow
(``workflow``), the engine's options (``options``) and the guard against use
after fork (``fork``).

May import: ``memable._background``, ``memable._store`` and the value
modules; never a store package (it speaks to a store through the protocol).
"""
