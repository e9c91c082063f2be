"""Whether an instance's status can have changed since this engine last read it.

A run reads its instance's status and owner before each step it executes,
so that a cancel or a takeover stored by another process stops it before
the next step starts. That read costs a read transaction (several
microseconds, a tenth of a small step). ``RunChecks`` lets the store answer
without it when nothing can have changed:

- In WAL mode every commit, by any connection of any process, raises the
  ``iChange`` counter of the WAL-index header (the start of the ``-shm``
  file) by one. Reading those 4 bytes from a read-only mapping of that
  file, made on SQLite's own descriptor, costs a memory load.
- This engine's own commits raise it too. A transaction of its group
  commit that committed and changed rows is one commit of its own: the
  counter is expected one higher. The instances whose status or owner it
  changed, or that it deleted, are forgotten: the connection's own triggers
  tell of each, whatever statement did it, so no writer declares what it
  may change and none can declare it wrong. An instance it created running,
  or claimed, is known as running without a read. Anything else (another
  connection's commit, a write outside the group commit, one that failed)
  leaves the counter or the connection's count of changed rows other than
  expected, and every instance known to be running is forgotten.

So an instance is answered for only while nothing but this engine's own
commits moved the counter since the store read it as running and owned,
and none of them changed its status or owner. Where the counter cannot be
read the store reads every time, except in memory, where no other
connection exists and the count of changed rows alone tells (a file store
not in WAL mode, or on a system without ``/proc/self/fd``, always reads).

Why SQLite's descriptor and not one of our own: a process's POSIX locks on
a file are all released when it closes *any* descriptor of that file, and
SQLite holds locks on the ``-shm`` file. Opening and later closing one here
would drop them. The mapping is made while the store's connection keeps
SQLite's descriptor open, and outlives it.

>>> import sqlite3
>>> conn = sqlite3.connect(":memory:")
>>> _ = conn.execute("CREATE TABLE instances (workflow, instance_id, status, owner)")
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


#: The connection's own triggers (``TEMP``): each change of an instance's status or owner,
#: and each instance deleted, by any statement of the connection, is told to its
#: ``RunChecks``.
_TRIGGERS = """
CREATE TEMP TRIGGER IF NOT EXISTS memable_status_changed
AFTER UPDATE OF status, owner ON main.instances
BEGIN SELECT memable_changed(NEW.workflow, NEW.instance_id); END;
CREATE TEMP TRIGGER IF NOT EXISTS memable_instance_deleted
AFTER DELETE ON main.instances
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
    """The WAL-index commit counter of one ``-shm`` file, mapped read-only into memory.

    Mapped with the C library's ``mmap`` on SQLite's own descriptor (Python's
    ``mmap`` would take a copy of the descriptor and close it again, which
    drops the locks). The mapping holds the file, whatever SQLite does with
    its descriptor. The file is never shorter than the page mapped while
    any connection has it open, and the store reads only while its own
    connection is open; ``close`` unmaps.
    """

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
        """The counter of the database file ``conn_file`` in WAL mode, or None.

        ``conn_file`` is the path SQLite reports for the main database
        (``PRAGMA database_list``), open on a connection that has read it.
        The descriptor is SQLite's own: the only one in this process open
        on the ``-shm`` file (with none, or several, None).
        """
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
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


class RunChecks:
    """The instances a store may report running and owned without reading them.

    Every method is called under the store's connection lock, which guards
    all the fields. ``counter`` is the file's WAL-index commit counter (None
    for a store no other connection can reach); ``conn`` the store's
    connection, whose ``total_changes`` counts the rows it changed. The
    connection gets temporary triggers (its own: no other connection has
    them) that tell this object of every change of an instance's status or
    owner, and of every instance deleted, by whatever statement of this
    connection: no writer declares what it may change.
    """

    def __init__(self, conn: sqlite3.Connection, counter: ShmCounter | None) -> None:
        self._conn = conn
        self._counter = counter
        # The counter and total_changes at the last look, plus this
        # connection's accounted commits since; None: nothing known.
        self._expected: tuple[int, int] | None = None
        self._running: set[tuple[str, str]] = set()
        # What the transaction in progress did to instances, in order: claimed one
        # (True: running and this store's, see ``claimed``), or changed one's status or
        # owner, or deleted it (False: a trigger said so).
        self._events: list[tuple[bool, str, str]] = []
        conn.create_function("memable_changed", 2, self._changed)
        conn.executescript(_TRIGGERS)

    def _changed(self, workflow: str, instance_id: str) -> None:
        """The triggers': a statement of this connection changed the instance's status
        or owner, or deleted it."""
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
        """A write of the transaction in progress made the instance running and this
        store's (its statements have run).

        Known once the transaction commits (``after_write``), as if read.
        """
        self._events.append((True, workflow, instance_id))

    def before_write(self) -> int:
        """Called before a write transaction; hand the result to ``after_write``."""
        self._events = []
        return self._conn.total_changes

    def after_write(self, before: int, ok: bool) -> None:
        """After a transaction: ``ok`` if it committed with no write refused.

        The instances it claimed are known running, and those whose status or
        owner it changed afterwards forgotten, in the order it did so. A
        transaction that changed rows made one commit: the counter is expected
        one higher. A failed one leaves the expectation as it was, so the next
        look finds the counter or the changes moved and forgets them all.
        """
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
