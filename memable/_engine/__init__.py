"""The public ``Engine``: registry, lifecycle, invoke, signal, resume, cancel, reads.

Its one job: ``engine.Engine`` in front of the runner, built by
``builder.EngineBuilder`` (options validated once), opening its store by
target (``targets``: a path, ``None`` for memory, or a ``postgresql://``
URL), making a new instance's row (``invoking``) and reading what is stored
(``stored``). Schedules will be declared here.

May import: ``memable._run``, ``memable._background``, the stores
(``memable._sqlite``, ``memable._postgres``: only to open them),
``memable._store`` and the value modules.
"""
