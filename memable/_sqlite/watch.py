"""Whether an instance's status can have changed since this engine last read it.

A run reads its instance's status and owner before each step (a tenth of a small step's
cost), so another process's cancel or takeover stops it. ``RunChecks`` answers without the
read while only this engine's own commits, none changing the instance, moved the counter:

- In WAL mode every commit, of any process, adds one to ``iChange`` in the WAL-index header
  (the start of the ``-shm`` file), read from a mapping made on SQLite's own descriptor.
- A commit of this engine's group commit that changed rows is expected to add one. The
  connection's own triggers report each instance whose status or owner changed, or that was
  deleted (no writer declares what it may change); one created running or claimed is known
  running. Anything else (another connection's commit, a write outside the group commit, a
  failure) leaves the counter or the changed-row count unexpected: all is forgotten.

In memory the changed-row count alone tells; a file store without WAL or ``/proc/self/fd``
always reads. SQLite's descriptor, not our own: closing *any* descriptor of a file drops the
process's POSIX locks on it, and SQLite holds locks on ``-shm``.

>>> import sqlite3
>>> conn = sqlite3.connect(":memory:")
>>> _ = conn.execute("CREATE TABLE memable_instances (workflow, instance_id, status, owner)")
>>> checks = RunChecks(conn, counter=None)
>>> checks.known_running("wf", "a")
False
>>> checks.saw_running("wf", "a")
>>> checks.known_running("wf", "a")
True
>>> conn.close()
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sqlite3
import struct
from typing import Any

#: Bytes of one copy of the WAL-index header; a commit writes the first copy last.
HEADER_BYTES = 48
_VERSION = struct.Struct("=I")  # native order
_WALINDEX_VERSION = 3007000


#: ``TEMP`` triggers: tell the connection's ``RunChecks`` of an instance's status, owner, deletion.
_TRIGGERS = """
CREATE TEMP TRIGGER IF NOT EXISTS memable_status_changed
AFTER UPDATE OF status, owner ON main.memable_instances
BEGIN SELECT memable_changed(NEW.workflow, NEW.instance_id); END;
CREATE TEMP TRIGGER IF NOT EXISTS memable_instance_deleted
AFTER DELETE ON main.memable_instances
BEGIN SELECT memable_changed(OLD.workflow, OLD.instance_id); END;
"""


def run_checks(conn: sqlite3.Connection, *, in_memory: bool) -> RunChecks | None:
    """The checks for a store on ``conn``, or None where it must read every time."""
    if in_memory:
        return RunChecks(conn, None)
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    files = {row[1]: row[2] for row in conn.execute("PRAGMA database_list")}
    shm = ShmCounter.open(files["main"]) if mode == "wal" and files.get("main") else None
    return None if shm is None else RunChecks(conn, shm)


class ShmCounter:
    """The WAL-index commit counter of one ``-shm`` file, mapped read-only with libc's ``mmap``
    (Python's dups the descriptor and closes the copy, dropping the locks). The file stays a
    page long while any connection has it open; the store reads only while its own is."""

    def __init__(self, address: int) -> None:
        self._address = address
        #: The counter: ``iChange`` of the first header copy, which a commit writes last.
        self.word = ctypes.c_uint32.from_address(address + 8)
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _libc().munmap(self._address, mmap.PAGESIZE)

    @classmethod
    def open(cls, conn_file: str) -> ShmCounter | None:
        """The counter of the main database ``conn_file`` (``PRAGMA database_list``) in WAL
        mode, mapped on SQLite's descriptor: the ``-shm``'s only one here (else None)."""
        fd = _sqlite_descriptor(conn_file + "-shm")
        if fd is None:
            return None
        try:
            libc = _libc()
            address = libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        except (OSError, AttributeError):
            return None
        if address in (None, ctypes.c_void_p(-1).value):
            return None
        counter = cls(address)
        header = ctypes.string_at(address, 2 * HEADER_BYTES)
        valid = (
            header[:HEADER_BYTES] == header[HEADER_BYTES:]
            and _VERSION.unpack_from(header, 0)[0] == _WALINDEX_VERSION
            and header[12] == 1  # isInit
        )
        if not valid:
            counter.close()
            return None
        return counter


def _sqlite_descriptor(shm: str) -> int | None:
    try:
        target = os.stat(shm)
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    if target.st_size < mmap.PAGESIZE:
        return None
    found: list[int] = []
    for name in names:
        try:
            st = os.fstat(int(name))
        except (ValueError, OSError):
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            found.append(int(name))
    return found[0] if len(found) == 1 else None


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


class RunChecks:
    """Instances a store may report running and owned unread; called under the store's
    connection lock, which guards every field. ``counter`` None: no other connection reaches it."""

    def __init__(self, conn: sqlite3.Connection, counter: ShmCounter | None) -> None:
        self._conn = conn
        self._counter = counter
        # (counter, total_changes) the next look expects; None: nothing known.
        self._expected: tuple[int, int] | None = None
        self._running: set[tuple[str, str]] = set()
        # The open transaction's events, in order: True for ``claimed``, False for a trigger's.
        self._events: list[tuple[bool, str, str]] = []
        conn.create_function("memable_changed", 2, self._changed)
        conn.executescript(_TRIGGERS)

    def _changed(self, workflow: str, instance_id: str) -> None:
        """The triggers': this connection changed the instance's status or owner, or deleted it."""
        self._events.append((False, workflow, instance_id))

    def known_running(self, workflow: str, instance_id: str) -> bool:
        """True if the instance was read as running and owned, and nothing changed since."""
        counter = self._counter
        now = (0 if counter is None else counter.word.value), self._conn.total_changes
        if now != self._expected:
            self._running.clear()
            self._expected = now
            return False
        return (workflow, instance_id) in self._running

    def saw_running(self, workflow: str, instance_id: str) -> None:
        """The store just read the instance as running and owned (after ``known_running``)."""
        self._running.add((workflow, instance_id))

    def claimed(self, workflow: str, instance_id: str) -> None:
        """The transaction in progress made the instance running and ours (known at commit)."""
        self._events.append((True, workflow, instance_id))

    def before_write(self) -> int:
        """Called before a write transaction; hand the result to ``after_write``."""
        self._events = []
        return self._conn.total_changes

    def after_write(self, before: int, ok: bool) -> None:
        """After a transaction (``ok``: committed, no write refused): apply its events in order;
        one that changed rows made one commit. A failed one makes the next look forget all."""
        expected, events, self._events = self._expected, self._events, []
        if not ok or expected is None or expected[1] != before:
            self._running.clear()
            return
        for claimed, workflow, instance_id in events:
            if claimed:
                self._running.add((workflow, instance_id))
            else:
                self._running.discard((workflow, instance_id))
        after = self._conn.total_changes
        if after != before and self._counter is not None:
            self._expected = ((expected[0] + 1) % (1 << 32), after)
        else:
            self._expected = (expected[0], after)

    def close(self) -> None:
        """The store is closing: let go of the counter."""
        if self._counter is not None:
            self._counter.close()
