"""A Hypothesis state machine: random operations on ONE file store, checked against a model.

The workflow (tests/_stateful_proc.py, importable by the child process too)
runs step a, suspends on "go", runs step b, a zero timer t and step c (which
fails on its first execution when the input is odd) and returns n*1000 plus
the payload of "go". Every step body logs its start and end to an O_APPEND
file, so executions are counted across processes. Rules invoke, signal
(the right key, a harmless unused key "zz", and "b", which the workflow uses
as a step), cancel, resume, restart the engine, and run an engine in a child
process that is SIGKILLed at a random moment; the engine in this process
then recovers what the child held. After every rule the store must come to
rest and satisfy the SPEC's guarantees (see ``check``).

Only the public API, real processes and read-only sqlite3 reads are used.
``pytest --hypothesis-profile=long`` runs it for minutes (tests/conftest.py).
"""

from __future__ import annotations

import functools
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from _stateful_proc import configure, read_log, workflow
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from memable import (
    Engine,
    InstanceFinished,
    Invocation,
    MetadataStatus,
    SignalRejected,
)

CHILD = str(Path(__file__).with_name("_stateful_proc.py"))
LEASE = 1.0  # seconds: this process's engines (a stopped one's lease runs out fast)
CHILD_LEASE = 60.0  # a killed child is dead by its pid, long before this lease expires
RECOVER_WITHIN = 20.0  # seconds after the kill: generous for a loaded machine, far below the lease
POLL = 0.05
SETTLE = 20.0  # seconds the store gets to come to rest after a rule
DELAY_HERE, DELAY_CHILD = 0.003, 0.01  # each step body sleeps this long
PAYLOADS = st.integers(0, 999)
INDEX = st.integers(0, 255)  # which instance a rule acts on (see pick)
KIND = {"a": "step", "b": "step", "c": "step", "go": "signal", "zz": "signal", "t": "timer"}


@dataclass
class Model:
    """What this test knows about one instance from acknowledged operations."""

    n: int
    go: int | None = None  # payload of an acknowledged "go" signal
    zz: int | None = None  # payload of an acknowledged signal for the unused key
    b_signal: bool = False  # a signal for "b" (a step key) was accepted
    b_rejected: bool = False  # ... or refused with SignalRejected (b was reached)
    cancelled: bool = False
    cancel_mark: int | None = None  # log length when cancel() returned
    cancel_refused: bool = False  # cancel() raised InstanceFinished (it had completed)


def recorded(method: Callable[..., None]) -> Callable[..., None]:
    """Keep a rule's or check's first failure for teardown, and skip the rest after it.

    Failures depend on timing, so a replay may fail one rule earlier or later;
    were it raised at once, the example would stop drawing at a different
    point and Hypothesis would call the data generation flaky. Raised from
    teardown, every example draws its full sequence of rules, and the
    exception keeps its traceback, so distinct failures stay distinct.
    """

    @functools.wraps(method)
    def run(self: StoreMachine, **kwargs: object) -> None:
        if self.failure is None:
            try:
                method(self, **kwargs)
            except Exception as exc:
                self.failure = exc

    return run


def status_name(meta: object) -> str:
    return type(meta.status).__name__  # type: ignore[attr-defined]


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="memable-stateful-"))
        self.db, self.log = self.dir / "store.db", self.dir / "effects.log"
        configure(str(self.log), DELAY_HERE)
        self.models: dict[str, Model] = {}
        self.allow: Counter[tuple[str, str]] = Counter()  # re-executions a kill allows
        self.killed: set[str] = set()  # pids of SIGKILLed children
        self.engines: list[Engine] = []
        self.children: list[subprocess.Popen[str]] = []
        self.next_id = 0
        self.failure: Exception | None = None  # the first, raised by teardown
        # Runs a rule started: settle() waits for them, as their claim is asynchronous
        # and the stored state from before it would look at rest.
        self.started: list[Invocation] = []
        self.engine: Engine | None = self.open_engine()

    # ------------------------------------------------------------------ helpers

    def open_engine(self) -> Engine:
        engine = Engine.open(self.db, lease=LEASE, poll_interval=POLL)
        self.engines.append(engine)
        engine.register("wf", workflow)
        engine.start()
        return engine

    def stop_engine(self) -> None:
        assert self.engine is not None
        self.engine.stop()
        self.engine.close()
        self.engine = None

    @property
    def live(self) -> Engine:
        assert self.engine is not None
        return self.engine

    def new_id(self) -> str:
        self.next_id += 1
        return f"i{self.next_id}"

    @staticmethod
    def pick(index: int, ids: list[str]) -> str | None:
        """The index-th of ids (modulo), or None: the draws never depend on the model,
        which a kill's timing decides, so Hypothesis replays every example the same."""
        return sorted(ids, key=lambda i: int(i[1:]))[index % len(ids)] if ids else None

    def waiting(self) -> list[str]:
        """Instances the model sees suspended on "go": not cancelled, not signalled."""
        return [i for i, m in self.models.items() if not m.cancelled and m.go is None]

    def starts(self) -> Counter[tuple[str, str]]:
        return Counter((r[0], r[1]) for r in read_log(str(self.log)) if r[2] == "start")

    def expected(self, instance_id: str, starts: Counter[tuple[str, str]]) -> tuple[str, str]:
        """The status the instance must have at rest, and a text its message must hold."""
        m = self.models[instance_id]
        if m.cancelled:
            return "Cancelled", ""
        if m.go is None:
            return "Suspended", "go"
        if m.b_signal:  # SPEC part 2: a signal stored early for a step key fails it there
            return "Failed", "'b'"
        if m.n % 2 and starts[instance_id, "c"] == 1:
            return "Failed", "'c'"
        return "Completed", ""

    def terminal(self, instance_id: str) -> bool:
        return self.expected(instance_id, self.starts())[0] != "Suspended"

    def at_rest(self, instance_id: str) -> bool:
        meta = self.live.get_metadata("wf", instance_id)
        if meta is None:
            return False
        if meta.status.is_terminal:
            return True
        return (
            isinstance(meta.status, MetadataStatus.Suspended)
            and meta.status.message == "go"
            and self.models[instance_id].go is None
        )

    def read_store(self, sql: str) -> list[tuple[object, ...]]:
        with closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)) as conn:
            return conn.execute(sql).fetchall()

    def settle(self) -> None:
        """Wait until every instance is terminal or suspended on a "go" not yet sent."""
        for inv in self.started:
            inv.wait(timeout=SETTLE)
        self.started.clear()
        deadline = time.monotonic() + SETTLE
        running = "SELECT instance_id FROM memable_instances WHERE status = 'running'"
        while busy := [i for i in self.models if not self.at_rest(i)] + self.read_store(running):
            if time.monotonic() > deadline:
                rows = self.read_store(
                    "SELECT instance_id, status, message, owner FROM memable_instances"
                )
                owners = self.read_store("SELECT id, pid, heartbeat FROM memable_owners")
                raise AssertionError(
                    f"not at rest after {SETTLE} s: {busy}\ninstances: {rows}\n"
                    f"owners: {owners} (now {time.time():.3f})"
                )
            time.sleep(0.01)

    # ------------------------------------------------------------------ rules

    @rule(n=st.integers(0, 99))
    @recorded
    def invoke(self, n: int) -> None:
        instance_id = self.new_id()
        inv = self.live.invoke("wf", n, instance_id=instance_id)
        assert inv.instance_id == instance_id
        self.models[instance_id] = Model(n)

    @rule(at=INDEX, n=st.integers(0, 99))
    @recorded
    def invoke_again(self, at: int, n: int) -> None:
        """An existing id: the same instance, nothing new runs, its stored input stands."""
        instance_id = self.pick(at, list(self.models))
        if instance_id is None:
            return
        assert self.live.invoke("wf", n, instance_id=instance_id).instance_id == instance_id

    @rule(at=INDEX, key=st.sampled_from(["go", "zz", "b"]), payload=PAYLOADS)
    @recorded
    def signal(self, at: int, key: str, payload: int) -> None:
        instance_id = self.pick(at, list(self.models))
        if instance_id is None:
            return
        m = self.models[instance_id]
        terminal = self.terminal(instance_id)
        already = {"go": m.go is not None, "zz": m.zz is not None, "b": m.b_signal}[key]
        try:
            self.started.append(self.live.signal("wf", instance_id, key, payload))
        except InstanceFinished:
            assert terminal, f"signal {key} to {instance_id}: InstanceFinished, model {m}"
        except SignalRejected:
            assert already, f"signal {key} to {instance_id}: SignalRejected, model {m}"
        else:
            assert not terminal, f"signal {key} to finished {instance_id} accepted: {m}"
            assert not already, f"second signal {key} to {instance_id} accepted: {m}"
            if key == "go":
                m.go = payload
            elif key == "zz":
                m.zz = payload
            else:
                m.b_signal = True

    @rule(at=INDEX, go=PAYLOADS, again=PAYLOADS)
    @recorded
    def signal_go_twice(self, at: int, go: int, again: int) -> None:
        """Back to back: the second signal for "go" is refused, whatever the run is doing."""
        instance_id = self.pick(at, self.waiting())
        if instance_id is None:
            return
        self.live.signal("wf", instance_id, "go", go)
        self.models[instance_id].go = go
        try:
            self.live.signal("wf", instance_id, "go", again)
        except (SignalRejected, InstanceFinished):
            pass
        else:
            raise AssertionError(f"a second signal for go to {instance_id} was accepted")

    @rule(at=INDEX, go=PAYLOADS, b=PAYLOADS)
    @recorded
    def signal_go_then_b(self, at: int, go: int, b: int) -> None:
        """Race a signal for the step key "b" against the run that "go" starts."""
        instance_id = self.pick(at, self.waiting())
        if instance_id is None:
            return
        m = self.models[instance_id]
        self.live.signal("wf", instance_id, "go", go)
        m.go = go
        try:
            self.started.append(self.live.signal("wf", instance_id, "b", b))
        except SignalRejected:
            # b was reached as a step (check() finds its step row), unless an
            # earlier signal already holds the key.
            m.b_rejected = not m.b_signal
        except InstanceFinished:
            pass  # the run already ended
        else:
            m.b_signal = True

    @rule(at=INDEX, go=PAYLOADS)
    @recorded
    def signal_go_then_cancel(self, at: int, go: int) -> None:
        """Cancel a run that a signal just started: at most the step in flight runs on."""
        instance_id = self.pick(at, self.waiting())
        if instance_id is None:
            return
        m = self.models[instance_id]
        self.live.signal("wf", instance_id, "go", go)
        m.go = go
        try:
            self.live.cancel("wf", instance_id)
        except InstanceFinished:
            m.cancel_refused = True
        else:
            m.cancelled, m.cancel_mark = True, len(read_log(str(self.log)))

    @rule(at=INDEX)
    @recorded
    def cancel(self, at: int) -> None:
        instance_id = self.pick(at, list(self.models))
        if instance_id is None:
            return
        m = self.models[instance_id]
        status = self.expected(instance_id, self.starts())[0]
        try:
            self.live.cancel("wf", instance_id)
        except InstanceFinished:
            assert status in ("Completed", "Cancelled"), f"cancel {instance_id} refused: {m}"
        else:
            assert status not in ("Completed", "Cancelled"), f"cancel of {status} {m} worked"
            m.cancelled, m.cancel_mark = True, len(read_log(str(self.log)))

    @rule(at=INDEX)
    @recorded
    def resume(self, at: int) -> None:
        instance_id = self.pick(at, list(self.models))
        if instance_id is None:
            return
        m = self.models[instance_id]
        try:
            self.started.append(self.live.resume("wf", instance_id))
        except InstanceFinished:
            assert m.cancelled, f"resume of {instance_id} refused: {m}"
        else:
            assert not m.cancelled, f"resume of cancelled {instance_id} worked"

    @rule(at=INDEX, race=st.sampled_from(["none", "go", "zz", "resume"]), payload=PAYLOADS)
    @recorded
    def restart(self, at: int, race: str, payload: int) -> None:
        """Stop and close the engine (just after a signal or resume starts a run) and open
        a new one."""
        instance_id = self.pick(at, self.waiting())
        if race != "none" and instance_id is not None:
            if race == "resume":
                self.live.resume("wf", instance_id)
            elif race == "zz" and self.models[instance_id].zz is None:
                self.live.signal("wf", instance_id, "zz", payload)
                self.models[instance_id].zz = payload
            elif race == "go":
                self.live.signal("wf", instance_id, "go", payload)
                self.models[instance_id].go = payload
        self.stop_engine()
        self.engine = self.open_engine()

    @rule(
        at=INDEX,
        new=st.lists(st.integers(0, 99), max_size=2),
        signals=st.lists(st.tuples(INDEX, PAYLOADS), max_size=2),
        resume=st.booleans(),
        cancel=st.booleans(),
        kill_after_ms=st.integers(0, 80),
        keep_engine=st.booleans(),
        reap_late=st.booleans(),
    )
    @recorded
    def kill_a_child(
        self,
        at: int,
        new: list[int],
        signals: list[tuple[int, int]],
        resume: bool,
        cancel: bool,
        kill_after_ms: int,
        keep_engine: bool,
        reap_late: bool,
    ) -> None:
        """A child engine invokes, signals and resumes; SIGKILL it at a random moment.

        With keep_engine this process's engine recovers the child's instances
        at a poll (and, with cancel, cancels the first instance the child
        signalled once the child said so, while the child runs it); otherwise
        it is closed first and a new one recovers them at start. With
        reap_late the child stays a zombie until its instances are recovered.
        """
        ops, fresh = [], {}
        for n in new:
            fresh[instance_id := self.new_id()] = n
            ops.append(f"invoke:{instance_id}:{n}")
        signalled: dict[str, int] = {}
        for index, go in signals:
            instance_id = self.pick(index, self.waiting())
            if instance_id is not None and instance_id not in signalled:
                signalled[instance_id] = go
                ops.append(f"signal:{instance_id}:go:{go}")
        resumable = [i for i, m in self.models.items() if not m.cancelled]
        if resume and resumable:
            ops.append(f"resume:{self.pick(at, resumable)}")
        if not keep_engine:
            self.stop_engine()
        with open(self.dir / f"child-{len(self.children)}.err", "w") as err:
            proc = subprocess.Popen(
                [sys.executable, CHILD, str(self.db), str(self.log), str(DELAY_CHILD),
                 str(CHILD_LEASE), *ops],
                stdout=subprocess.PIPE, stderr=err, text=True,
            )
        self.children.append(proc)
        out = self.read_until(proc, "ready")
        if cancel and keep_engine and signalled:
            target, go = next(iter(signalled.items()))
            out += self.read_until(proc, f"ok signal:{target}:go:{go}")
            self.models[target].go = go
            try:
                self.live.cancel("wf", target)
            except InstanceFinished:
                self.models[target].cancel_refused = True
            else:
                self.models[target].cancelled = True
                self.models[target].cancel_mark = len(read_log(str(self.log)))
        time.sleep(kill_after_ms / 1000)
        proc.send_signal(signal.SIGKILL)
        if not reap_late:
            proc.wait(timeout=30)
        self.killed.add(str(proc.pid))
        # A run executes its steps one after another: of each instance, only the
        # last step the killed child started can have been in flight.
        last: dict[str, str] = {}
        for r in read_log(str(self.log)):
            if r[2] == "start" and r[3].split(".")[0] == str(proc.pid):
                last[r[0]] = r[1]
        for instance_id, key in last.items():
            self.allow[instance_id, key] += 1
        if self.engine is None:
            self.engine = self.open_engine()
        self.check_recovered(proc.pid, zombie=reap_late)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        out += proc.stdout.read().splitlines()
        proc.stdout.close()
        cancelled_here = [f"err resume:{i} InstanceFinished" for i in signalled if cancel]
        assert not [x for x in out if x.startswith("err") and x not in cancelled_here], out
        acked = {line[3:] for line in out if line.startswith("ok ")}
        # What the child did without saying so before it died is read from the store.
        for instance_id, n in fresh.items():
            stored = self.live.get_metadata("wf", instance_id) is not None
            assert stored or f"invoke:{instance_id}:{n}" not in acked, f"lost {instance_id}"
            if stored:
                self.models[instance_id] = Model(n)
        for instance_id, go in signalled.items():
            steps = {s.key: s for s in self.live.steps("wf", instance_id)}
            stored = "go" in steps and steps["go"].state == "completed"
            assert stored or f"signal:{instance_id}:go:{go}" not in acked, f"lost go {instance_id}"
            if stored:
                self.models[instance_id].go = go

    @staticmethod
    def read_until(proc: subprocess.Popen[str], want: str) -> list[str]:
        """The child's stdout lines up to and including ``want`` (30 s, then it is killed)."""
        assert proc.stdout is not None
        guard = threading.Timer(30, proc.kill)
        guard.start()
        lines: list[str] = []
        try:
            while (line := proc.stdout.readline()) and line.strip() not in (want, "done"):
                lines.append(line.strip())
        finally:
            guard.cancel()
        assert line.strip() == want, f"child never said {want!r}: {lines}"
        return [*lines, want]

    def check_recovered(self, pid: int, *, zombie: bool) -> None:
        """A killed owner (a zombie too) is dead at once: its running instances are
        taken well before its lease (CHILD_LEASE) could expire."""
        held = (
            "SELECT i.instance_id FROM memable_instances i "
            "JOIN memable_owners o ON o.id = i.owner "
            f"WHERE i.status = 'running' AND o.pid = {pid}"
        )
        deadline = time.monotonic() + RECOVER_WITHIN
        while rows := self.read_store(held):
            assert time.monotonic() < deadline, (
                f"killed owner pid {pid} (zombie: {zombie}) still holds {rows} after "
                f"{RECOVER_WITHIN} s; its lease is {CHILD_LEASE} s"
            )
            time.sleep(0.02)

    # ------------------------------------------------------------------ checks

    @invariant()
    @recorded
    def check(self) -> None:
        self.settle()
        rows = read_log(str(self.log))
        starts = self.starts()
        self.check_no_overlap(rows)
        stored_ids = {i for i, _ in self.live.list_instances("wf")}
        assert stored_ids == set(self.models), f"store {stored_ids} != model {set(self.models)}"
        for instance_id, m in self.models.items():
            self.check_instance(instance_id, m, starts, rows)

    def check_no_overlap(self, rows: list[list[str]]) -> None:
        """At most one run per instance at a time: no step starts while another is open."""
        open_by: dict[str, str] = {}
        for instance_id, key, what, who in rows:
            if what == "start":
                other = open_by.get(instance_id)
                assert other is None or other.split(".")[0] in self.killed, (
                    f"{instance_id} {key} started by {who} while {other} ran a step"
                )
                open_by[instance_id] = who
            elif open_by.get(instance_id) == who:
                del open_by[instance_id]

    def check_instance(
        self, instance_id: str, m: Model, starts: Counter[tuple[str, str]], rows: list[list[str]]
    ) -> None:
        meta = self.live.get_metadata("wf", instance_id)
        assert meta is not None
        want, needle = self.expected(instance_id, starts)
        where = f"{instance_id} ({m}, starts a/b/c {[starts[instance_id, k] for k in 'abc']})"
        assert status_name(meta) == want, f"{where}: {meta.status}, expected {want}"
        assert needle in (meta.status.message or ""), f"{where}: {meta.status} lacks {needle}"
        if m.cancel_refused:
            assert want == "Completed", f"{where}: cancel refused, yet not completed"
        # Each step body ran at most once, but the first of c with an odd input
        # fails, and a kill may re-run the step it interrupted.
        for key in "abc":
            limit = 1 + (key == "c" and m.n % 2) + self.allow[instance_id, key]
            assert starts[instance_id, key] <= limit, f"{where}: {key} ran more than {limit}"
        if m.b_signal:
            assert starts[instance_id, "b"] == 0, f"{where}: b ran, its key signalled"
        steps = {s.key: s for s in self.live.steps("wf", instance_id)}
        assert set(steps) <= set(KIND), f"{where}: unexpected keys {set(steps)}"
        for key, record in steps.items():
            kind = "signal" if key == "b" and m.b_signal else KIND[key]
            assert record.kind == kind, f"{where}: {key} stored as {record.kind}, used as {kind}"
        # Nothing acknowledged is lost.
        for key, payload in (("go", m.go), ("zz", m.zz)):
            if payload is not None:
                assert key in steps, f"{where}: acknowledged signal {key} missing"
                assert steps[key].state == "completed", f"{where}: {steps[key]}"
                assert steps[key].result == payload, f"{where}: {key} holds {steps[key].result}"
        if m.b_rejected:
            assert "b" in steps, f"{where}: b refused, never reached"
            assert steps["b"].kind == "step", f"{where}: b refused, not a step"
        if want == "Completed":
            for key in "abc":
                assert starts[instance_id, key] >= 1, f"{where}: completed without running {key}"
            assert all(s.state == "completed" for s in steps.values()), f"{where}: {steps}"
            output = self.live.invocation("wf", instance_id).result(timeout=5)
            assert output == m.n * 1000 + m.go, f"{where}: output {output}"  # type: ignore[operator]
        if m.cancel_mark is not None:  # only the step in flight at cancel() may run on
            after = [r for r in rows[m.cancel_mark:] if r[0] == instance_id and r[2] == "start"]
            assert len(after) <= 1, f"{where}: steps ran after cancel() returned: {after}"

    # ------------------------------------------------------------------ teardown

    def teardown(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
        for engine in self.engines:
            engine.stop()
            engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.failure is not None:
            raise self.failure
        leaked = [t.name for t in threading.enumerate() if t.name.startswith("memable")]
        assert not leaked, f"memable threads outlived their engines: {leaked}"


TestStoreMachine = StoreMachine.TestCase
