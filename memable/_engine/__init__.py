"""The public ``Engine``: registry, lifecycle, invoke, signal, resume, cancel, reads.

Its one job: ``engine.Engine`` in front of the runner, built by
``builder.EngineBuilder`` (options checked once), opening its store by target
(``targets``) and reading what its Invocations need (``stored``).

May import: ``memable._schedules``, ``memable._run``, ``memable._background``,
the stores (only to open them), ``memable._store`` and the value modules.
"""
