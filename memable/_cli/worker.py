"""``memable worker MODULE:ENGINE``: run a user's engine until SIGINT or SIGTERM.

On a signal the worker takes no new work and lets the runs in flight end; a run still going
after the grace period is left (exit 1), for the next engine on the store to recover."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .._clock import iso_utc
from .._engine import access
from .._engine.engine import Engine
from .._errors import EngineError, StorageError
from .._log import log


class WorkerError(EngineError):
    """The worker cannot load or start the engine it was given."""


def load_engine(spec: str) -> Engine:
    """The Engine named by ``module:attribute`` (an Engine, or a function returning one)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise WorkerError(f"expected MODULE:ENGINE, e.g. myapp.workflows:engine, not {spec!r}")
    # Like other app servers: the current directory is importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkerError(f"cannot import {module_name!r} ({exc})") from exc
    for name in attribute.split("."):
        try:
            found = getattr(found, name)
        except AttributeError:
            raise WorkerError(f"{module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(found, Engine) and callable(found):
        found = found()
    if not isinstance(found, Engine):
        raise WorkerError(f"{spec} is not a memable Engine (it is a {type(found).__name__})")
    return found


def _log_to_stderr() -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s memable: %(message)s"))
    log.addHandler(handler)
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)
    return handler


_STOP = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def _stop_signals() -> Iterator[Callable[[], int]]:
    """Hold SIGINT and SIGTERM for a wait; yield the function that waits for one.

    On POSIX they are blocked before any engine thread starts (threads inherit the mask) and
    taken with ``sigwait``, so no handler interrupts other code; elsewhere a handler notes one."""
    if hasattr(signal, "pthread_sigmask"):
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP)
        try:
            yield lambda: signal.sigwait(_STOP)
        finally:
            # A second signal during the drain is taken here, not delivered later.
            for pending in signal.sigpending() & _STOP:
                signal.sigwait({pending})
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return
    received: list[int] = []  # pragma: no cover - platforms without sigwait
    old = {sig: signal.signal(sig, lambda signum, _: received.append(signum)) for sig in _STOP}

    def wait() -> int:  # pragma: no cover
        while not received:
            threading.Event().wait(0.2)  # no sigwait: look a few times a second
        return received[0]

    try:  # pragma: no cover
        yield wait
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def run_worker(
    load: Callable[[], Engine], *, threads: int | None, grace: float,
    queues: list[str] | None = None, retention: float | None = None,
) -> int:
    """Run the engine ``load()`` makes until SIGINT or SIGTERM, drain it; return the exit code.

    Loaded with the signals blocked, so every thread its module starts (an OpenTelemetry
    exporter's) inherits the mask: a second signal in the drain cannot reach one and end the
    process. ``queues`` and ``retention`` (seconds) override the engine's options unless None."""
    handler = _log_to_stderr()
    try:
        with _stop_signals() as wait_for_signal:
            engine = load()
            engine._configure(threads, queues, retention)
            engine.start()
            log.info("worker %d started: %r", os.getpid(), engine)
            signum = wait_for_signal()
            log.info("received %s: taking no new work", signal.Signals(signum).name)
            # stop() on a thread of its own, so the grace period can run out while it waits.
            drain = threading.Thread(target=engine.stop, name="memable-drain", daemon=True)
            drain.start()
            left = _drain(engine, drain, grace)
        if left is not None:
            handler.flush()
            os._exit(left)  # the worker threads cannot be interrupted, only abandoned
        engine.close()
        log.info("worker %d stopped", os.getpid())
        return 0
    finally:
        log.removeHandler(handler)


def _drain(engine: Engine, drain: threading.Thread, grace: float) -> int | None:
    """Wait for ``drain`` (engine.stop) up to ``grace`` seconds; None once it ended.

    It gives up sooner when every run left is of a cancelled instance (a hung step: nothing
    to recover), looking once per poll interval; else, past the grace, it logs the runs left
    and returns 1 if the next engine is to recover some, 0 if all were cancelled."""
    deadline = time.monotonic() + grace
    while True:
        runs = access.in_flight(engine)
        if not runs:
            drain.join()  # stop() has nothing to wait for but its own threads
            return None
        cancelled = [run for run in runs if _is_cancelled(engine, run[0], run[1])]
        remaining = deadline - time.monotonic()
        if len(cancelled) == len(runs) or remaining <= 0:
            break
        drain.join(min(remaining, access.poll_interval(engine)))
        if not drain.is_alive():
            return None
    others = [run for run in runs if run not in cancelled]
    if cancelled:
        log.warning("leaving %s: cancelled, its step still running", _names(cancelled))
    if others:
        log.error("%s still in flight after the %gs grace period; exiting, the next engine on "
            "the store recovers %s", _names(others), grace, "it" if len(others) == 1 else "them")
        return 1
    return 0


def _is_cancelled(engine: Engine, workflow: str, instance_id: str) -> bool:
    """Whether the instance is stored cancelled; False while the store cannot say (it is
    unreachable: the drain waits for stop(), which returns within the lease)."""
    try:
        metadata = engine.get_metadata(workflow, instance_id)
    except StorageError:
        return False
    return metadata is not None and metadata.status.name == "cancelled"


def _names(runs: list[tuple[str, str, str | None, float | None]]) -> str:
    return ", ".join(
        f"{w}/{i}" + (f" [{key} since {iso_utc(since)}]" if key and since is not None else "")
        for w, i, key, since in runs)
