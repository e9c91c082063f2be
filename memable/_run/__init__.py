"""Running instances: from a submitted run to its recorded end.

Its one job: ``runner.Runner``, the lifecycle, composed of ``registry`` (what the engine
runs, the phase, the one lock), ``runs`` (runs in flight, the worker pool) and ``claims``
(wake-ups, queue claims, the poll's look, the lease); one run (``run``), what a workflow sees
(``context.Context``, with ``step``, ``attempts``, ``fan_out``, ``children``), what a caller
holds (``invocation.Invocation``), ``control``, ``workflow``, ``options`` and ``fork``.

May import: ``memable._background``, ``memable._store`` and the value modules; never a store
package (it speaks to a store through the protocol)."""
