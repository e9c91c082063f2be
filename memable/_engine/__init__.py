"""The public ``Engine``: registry, lifecycle, invoke, signal, resume, cancel, reads.

Its one job: ``engine.Engine`` in front of the runner, built by ``builder.EngineBuilder``,
opening its store by target (``targets``) and reading what Invocations need (``stored``).

May import: ``memable._schedules``, ``_run``, ``_background``, the stores (only to open
them), ``_store`` and the value modules."""
