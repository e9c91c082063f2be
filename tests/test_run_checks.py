"""The read before each step, and when the store may skip it (``memable._sqlite.watch``).

A run checks its instance's status before each step it executes; the SQLite
store skips the read while nothing but its own step writes committed since
it last read the instance as running. These tests count the statements the
store runs, and cancel from real processes between two steps, so that a
skip that is wrong (a missed commit) fails them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest
from helpers import queued_row, traced_sqlite

from memable import Cancelled, Context, Engine
from memable._clock import SYSTEM_CLOCK, iso_utc
from memable._sqlite import watch as sqlite_watch
from memable._sqlite.store import SQLiteStore
from memable._store.control import LostInstance
from memable._store.protocol import InstanceRow, StepWrite

WAIT = 60.0


def reads(statements: list[str]) -> int:
    return sum(s.startswith("SELECT status, owner FROM memable_instances") for s in statements)


def start(store: SQLiteStore, instance_id: str) -> None:
    """Create ``wf/<instance_id>`` running and claim it."""
    wall = SYSTEM_CLOCK.wall()
    now = iso_utc(wall)
    store.create_instance(InstanceRow(
        workflow="wf", instance_id=instance_id, status="running", message=None, input="null",
        input_type=None, output=None, output_type=None, created_at=now, updated_at=now,
        completed_at=None))
    assert store.begin_run("wf", instance_id, now=wall, claim="resume") is not None


def queue(store: SQLiteStore, instance_id: str) -> None:
    """Store ``wf/<instance_id>`` queued on ``q`` and claim it through the queue."""
    wall = SYSTEM_CLOCK.wall()
    now = iso_utc(wall)
    store.create_instance(queued_row(instance_id, at=now))
    claimed = store.claim_queued("q", ["wf"], concurrency=None, per_process=None, rate=None,
                                 clock=time.time, at=wall, batch=8)
    assert [s.instance.instance_id for s in claimed.snapshots] == [instance_id]


def running_store(path: Path | None) -> SQLiteStore:
    """A store with one instance ``wf/x`` claimed by it and running."""
    store = SQLiteStore(path, "normal")
    store.register_owner(15.0, 0.0)
    start(store, "x")
    return store


def step(key: str) -> StepWrite:
    at = SYSTEM_CLOCK.wall()
    return StepWrite(
        workflow="wf", instance_id="x", key=key, seq=0, kind="step", state="completed",
        result="1", result_type=None, status=None, error=None, at=at, started=at,
    )


def test_a_file_store_reads_again_only_after_another_commit(tmp_path: Path) -> None:
    """A file store reads the instance's status once, then skips the read after its own step
    write and its own claims (of another instance, or through a queue: those become known too);
    a write from another connection, also after a WAL checkpoint, makes it read again, and so it
    sees a cancel."""
    db = tmp_path / "db"
    store = running_store(db)
    assert store._checks is not None, "the WAL counter was not found: every check reads"
    with closing(sqlite3.connect(db, isolation_level=None)) as other, traced_sqlite(store) as seen:
        assert store.check_run("wf", "x") == "running"
        assert reads(seen) == 1
        store.save_step(step("a"))  # its own step write: nothing to read again
        assert store.check_run("wf", "x") == "running"
        assert reads(seen) == 1
        start(store, "y")  # another instance's claim leaves x known, and y is known
        assert store.check_run("wf", "x") == "running"
        assert store.check_run("wf", "y") == "running"
        assert reads(seen) == 1
        queue(store, "z")  # so does a queue's claim, and what it claimed is known too
        assert store.check_run("wf", "x") == "running"
        assert store.check_run("wf", "z") == "running"
        assert reads(seen) == 1
        other.execute("UPDATE memable_instances SET status_message = 'elsewhere'")
        assert store.check_run("wf", "x") == "running"
        assert reads(seen) == 2
        other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        other.execute("UPDATE memable_instances SET status_message = 'after a checkpoint'")
        assert store.check_run("wf", "x") == "running"
        assert reads(seen) == 3
        other.execute("UPDATE memable_instances SET status = 'cancelled'")
        assert store.check_run("wf", "x") == "cancelled"
    store.close()


@pytest.mark.parametrize("where", ["memory", "file"])
def test_the_stores_own_cancel_is_read_at_the_next_check(tmp_path: Path, where: str) -> None:
    """On an in-memory store and a file, a cancel made through the store itself is seen at the
    next check, though the checks before it skipped the read."""
    store = running_store(None if where == "memory" else tmp_path / "db")
    with traced_sqlite(store) as seen:
        assert store.check_run("wf", "x") == "running"
        assert store.check_run("wf", "x") == "running"
        assert reads(seen) == 1
        store.cancel("wf", "x", now=SYSTEM_CLOCK.wall())
        assert store.check_run("wf", "x") == "cancelled"
    store.close()


@pytest.mark.parametrize("where", ["memory", "file"])
def test_any_write_of_the_store_that_changes_a_status_is_read_at_the_next_check(
    tmp_path: Path, where: str
) -> None:
    """A write through the store's group commit that changes the instance's status, or its
    owner, or deletes it, declaring nothing of what it changes (as a new operation would),
    is seen at the next check: the connection's triggers told the checks. (Before, each
    write declared what it may change; one that declared "none" and cancelled went unseen,
    and the run went on.)"""
    for change, expected in [
        ("UPDATE memable_instances SET status = 'cancelled' WHERE instance_id = 'x'", "cancelled"),
        ("UPDATE memable_instances SET owner = 'another' WHERE instance_id = 'x'", LostInstance),
        ("DELETE FROM memable_instances WHERE instance_id = 'x'", LostInstance),
    ]:
        store = running_store(None if where == "memory" else tmp_path / f"db{len(change)}")
        with traced_sqlite(store) as seen:
            assert store.check_run("wf", "x") == "running"
            assert store.check_run("wf", "x") == "running"
            assert reads(seen) == 1  # known running: the second check did not read
            store._commits.write("change it", "wf", "x", None,
                                 lambda conn, change=change: conn.execute(change))
            if expected is LostInstance:
                with pytest.raises(LostInstance):
                    store.check_run("wf", "x")
            else:
                assert store.check_run("wf", "x") == expected
            assert reads(seen) == 2
        store.close()


def test_a_store_that_cannot_see_the_counter_reads_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No /proc, or another descriptor on the -shm file: no skipping, same answers."""
    monkeypatch.setattr(sqlite_watch, "_sqlite_descriptor", lambda shm: None)
    store = running_store(tmp_path / "db")
    assert store._checks is None
    with traced_sqlite(store) as seen:
        for _ in range(3):
            assert store.check_run("wf", "x") == "running"
        assert reads(seen) == 3
    store.close()


def _cancel_from_another_process(db: Path, checkpoint: bool) -> None:
    if checkpoint:  # the WAL starts over: the header is rewritten from scratch
        subprocess.run(
            [sys.executable, "-c", "import sqlite3, sys; sqlite3.connect(sys.argv[1])"
             ".execute('PRAGMA wal_checkpoint(TRUNCATE)')", str(db)],
            check=True, timeout=WAIT,
        )
    subprocess.run(
        [sys.executable, "-m", "memable", "cancel", str(db), "wf", "x"],
        check=True, timeout=WAIT, capture_output=True,
    )


@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "after-checkpoint"])
def test_a_cancel_from_another_process_between_steps_stops_the_next_one(
    tmp_path: Path, checkpoint: bool
) -> None:
    """Steps before it ran unread; the cancel commits while a step runs; no step after it.

    The engine polls once a minute, so only the read before each step can
    see the cancel.
    """
    db = tmp_path / "db"
    engine = Engine.open(db, poll_interval=60)
    inside, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocking() -> None:
        inside.set()
        assert release.wait(WAIT)
        ran.append("blocking")

    def wf(ctx: Context) -> None:
        for i in range(20):  # checked once, then skipped
            ctx.step(f"warm{i}").run(lambda: None)
        ctx.step("blocking").run(blocking)
        ctx.step("after").run(lambda: ran.append("after"))

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf", instance_id="x")
        assert inside.wait(WAIT)
        _cancel_from_another_process(db, checkpoint)
        release.set()
        assert inv.wait(timeout=WAIT) == Cancelled()
    engine.close()
    assert ran == ["blocking"]


# ---------------------------------------------------------------------- the counter itself


def shm_maps(db: Path) -> int:
    """How many mappings of the store's -shm file this process has (deleted or not)."""
    shm = f"{db}-shm"
    with open("/proc/self/maps") as maps:
        return sum(line.rstrip("\n").removesuffix(" (deleted)").endswith(shm) for line in maps)


def test_a_write_that_changed_no_row_keeps_the_instances_known(tmp_path: Path) -> None:
    """No row changed: no commit, so the counter is expected where it was."""
    store = running_store(tmp_path / "db")
    with traced_sqlite(store) as seen:
        assert store.check_run("wf", "x") == "running"
        store.record_in_flight([("wf", "no-such-instance", "k", time.time())])
        store.save_step(step("a"))
        store.record_in_flight([("wf", "no-such-instance", "k", time.time())])
        assert store.check_run("wf", "x") == "running"
        assert reads(seen) == 1
    store.close()


class _Word:
    value = 0


class _Counter:
    """Stands for ShmCounter: a counter word the test sets."""

    def __init__(self) -> None:
        self.word = _Word()

    def close(self) -> None:
        pass


def test_the_counter_wraps_around_at_32_bits() -> None:
    """A commit that takes the WAL counter word from 2**32 - 1 to 0 counts as the one commit
    expected, so the run's instance stays known running."""
    counter = _Counter()
    counter.word.value = 0xFFFFFFFF
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("CREATE TABLE memable_instances (workflow, instance_id, status, owner)")
    checks = sqlite_watch.RunChecks(conn, counter)  # type: ignore[arg-type]
    assert not checks.known_running("wf", "x")
    checks.saw_running("wf", "x")
    before = checks.before_write()
    conn.execute("INSERT INTO t VALUES (1)")
    counter.word.value = 0  # the commit raised the counter past 2**32 - 1
    checks.after_write(before, ok=True)
    assert checks.known_running("wf", "x")
    conn.close()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc (Linux)")
def test_closing_the_store_unmaps_the_counter(tmp_path: Path) -> None:
    """Closing the store unmaps its mapping of the -shm file, leaving none in the process."""
    db = tmp_path / "db"
    store = running_store(db)
    assert store._checks is not None
    assert shm_maps(db) >= 2  # SQLite's and the counter's
    store.close()
    assert shm_maps(db) == 0


def test_a_failed_mapping_means_no_counter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When mapping the -shm file fails (mmap returns MAP_FAILED), the store has no counter and
    its checks read every time, still answering."""
    real = sqlite_watch._libc()

    class FailingLibc:
        munmap = real.munmap

        @staticmethod
        def mmap(*args: object) -> int | None:
            return ctypes.c_void_p(-1).value  # MAP_FAILED

    monkeypatch.setattr(sqlite_watch, "_libc", FailingLibc)
    store = running_store(tmp_path / "db")
    assert store._checks is None
    assert store.check_run("wf", "x") == "running"
    store.close()


@pytest.mark.parametrize(
    "damage", ["copies differ", "wrong version", "not initialised"]
)
def test_a_header_that_is_not_a_wal_index_means_no_counter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """The mapped file must hold a WAL-index header (two equal copies, version, isInit)."""
    header = bytearray(struct.pack("=I", 3007000) + bytes(44))
    header[12] = 1
    first, second = bytearray(header), bytearray(header)
    if damage == "copies differ":
        second[8] = 7
    elif damage == "wrong version":
        first[0] = second[0] = 9
    else:
        first[12] = second[12] = 0
    fake = tmp_path / "fake-shm"
    fake.write_bytes(bytes(first + second) + bytes(mmap.PAGESIZE))
    fd = os.open(fake, os.O_RDONLY)  # not a SQLite file: closing it drops no lock
    try:
        monkeypatch.setattr(sqlite_watch, "_sqlite_descriptor", lambda shm: fd)
        assert sqlite_watch.ShmCounter.open(str(tmp_path / "anything")) is None
        fake.write_bytes(bytes(header + header) + bytes(mmap.PAGESIZE))
        counter = sqlite_watch.ShmCounter.open(str(tmp_path / "anything"))
        assert counter is not None
        counter.close()
    finally:
        os.close(fd)


def test_a_second_descriptor_on_the_shm_file_means_no_counter(tmp_path: Path) -> None:
    """Two descriptors: one may not be SQLite's, so the store reads every time."""
    db = tmp_path / "db"
    first = running_store(db)
    assert first._checks is not None
    extra = os.open(f"{db}-shm", os.O_RDONLY)
    try:
        second = SQLiteStore(db, "normal")
        assert second._checks is None
        second.close()
    finally:
        first.close()
        os.close(extra)  # after every connection to the file: no lock of theirs to drop


def test_the_descriptor_scan_skips_what_it_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan for SQLite's descriptor on the -shm file passes over entries of /proc/self/fd
    that are not numbers or no longer open, and still finds the counter."""
    real = os.listdir
    monkeypatch.setattr(
        sqlite_watch.os, "listdir",
        lambda path: ["not-a-descriptor", "999999", *real(path)],
    )
    store = running_store(tmp_path / "db")
    assert store._checks is not None
    store.close()
