"""The registry: what an engine runs, where its lifecycle is, and the runner's one lock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, Protocol

import attrs

from .._errors import AlreadyStarted, NotStarted, WorkflowNotFound
from .._queues import QueueSpec
from .fork import ForkGuard
from .options import Options
from .workflow import Workflow

Phase = Literal["new", "started", "stopped", "closed"]


class Ticker(Protocol):
    """A part the timer thread looks with too (an engine's schedules): at each look it fires
    what fell due and says when it next needs one. The runner knows nothing else of it."""

    def declares(self) -> dict[str, list[str]]:
        """What the engine's owner row says of it (``Declarations.schedules``)."""

    def start(self, now: float) -> None:
        """The engine starts (its owner row is stored; no thread looks yet)."""

    def look(self, now: float) -> tuple[int, float | None]:
        """Fire what is due at ``now``: how many runs that made, and seconds to its next look."""


class Registry:
    """The workflows, queues and tickers declared, the options, and the phase.

    >>> registry = Registry(Options())
    >>> registry.declare_queue(QueueSpec.declare("q"))
    >>> sorted(registry.queues), registry.phase, registry.accepting
    (['q'], 'new', False)
    """

    def __init__(self, options: Options) -> None:
        # The runner's one lock: the phase is checked in the same hold as what depends on it (a
        # run registered only while started; stop interrupts every run registered before it),
        # so the parts share it rather than each having its own. It guards:
        #   here: phase, accepting; the options and declarations (workflows, queues, tickers)
        #     until start, then fixed and read without it;
        #   in Runs: _active, _watches, turnover, _firing, the _idle condition (on it) and
        #     _executor (made at start); in each active Run, rerun, cancel_requested (read
        #     without it by the run's own thread) and signalled; a run's Context takes it as its
        #     flight lock (the steps in flight, against Engine.signal);
        #   in Claims: _claiming; its queue consumer and threads are made under it at start.
        # Lock order: this lock, then a Watch's cond, then the store's lock; never the reverse.
        self.lock = threading.Lock()
        self.phase: Phase = "new"
        self.accepting = False  # user calls (invoke, resume) are taken
        self.options = options
        self.workflows: dict[str, Workflow] = {}
        self.queues: dict[str, QueueSpec] = {}
        self.tickers: list[Ticker] = []
        self._fork = ForkGuard()  # nothing here works in a forked child

    def check_fork(self) -> None:
        """Raise EngineError in a child forked after this engine was made."""
        self._fork.check()

    def require_accepting(self, name: str) -> None:
        """Raise NotStarted unless user calls are taken (started, not draining)."""
        self.check_fork()
        with self.lock:
            if not self.accepting:
                raise NotStarted(name, self.phase)

    def workflow(self, name: str) -> Workflow:
        """The workflow registered under ``name`` (WorkflowNotFound if none)."""
        workflow = self.workflows.get(name)
        if workflow is None:
            raise WorkflowNotFound(name)
        return workflow

    def register(self, workflow: Workflow) -> None:
        with self.lock:
            if self.phase != "new":
                raise AlreadyStarted(workflow.name, self.phase)
            if workflow.name in self.workflows:
                raise ValueError(f"workflow {workflow.name!r} is already registered")
            self.workflows[workflow.name] = workflow

    def declare_queue(self, spec: QueueSpec) -> None:
        with self.lock:
            if self.phase != "new":
                raise AlreadyStarted(phase=self.phase)
            if spec.name in self.queues:
                raise ValueError(f"queue {spec.name!r} is already declared")
            self.queues[spec.name] = spec

    @contextmanager
    def declaring(self) -> Iterator[None]:
        """Hold the lock while a declaration is recorded: only before start."""
        with self.lock:
            if self.phase != "new":
                raise AlreadyStarted(phase=self.phase)
            yield

    def add_ticker(self, ticker: Ticker) -> None:
        with self.lock:
            if self.phase != "new":
                raise AlreadyStarted(phase=self.phase)
            self.tickers.append(ticker)

    def set_options(self, **changes: Any) -> None:
        """Change options before start (``memable worker --threads``, ``--queues``)."""
        with self.lock:
            if self.phase != "new":
                raise AlreadyStarted()
            self.options = attrs.evolve(self.options, **changes)
