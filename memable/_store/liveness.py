"""Who this process is, and whether an owner process on this host still lives.

An owner is judged by pid only when provably in this process's PID namespace on this boot
(same host name, boot id and PID namespace: containers sharing a host name differ); else its
lease decides. A pid is dead when no process has it, it is a zombie, or its process started
after the owner's (the pid was reused)."""

from __future__ import annotations

import os
import socket
import uuid

import attrs


@attrs.frozen
class Identity:
    """What names a process across hosts, boots and PID namespaces."""

    host: str
    pid: int
    boot_id: str | None  # None where the OS does not say (not Linux)
    pid_ns: str | None
    started: str | None  # the process's start time in clock ticks since boot


OWNER_SUFFIX = 12


def owner_id(me: Identity) -> str:
    """A new owner id: ``host:pid:`` and random hex, so the id alone names the process, even
    once its owner row is gone.

    >>> owner = owner_id(Identity("web-1", 4242, None, None, None))
    >>> owner.startswith("web-1:4242:"), len(owner) == len("web-1:4242:") + OWNER_SUFFIX
    (True, True)
    """
    return f"{me.host}:{me.pid}:{uuid.uuid4().hex[:OWNER_SUFFIX]}"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as file:
            return file.read().strip()
    except OSError:
        return None


def _pid_ns() -> str | None:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if there is none."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    # The command name is in parentheses and may hold spaces and parentheses.
    return text[text.rfind(")") + 2 :].split()


def current() -> Identity:
    """This process's identity (read afresh: a forked child is another process)."""
    pid = os.getpid()
    fields = _stat_fields(pid)
    return Identity(host=socket.gethostname(), pid=pid,
        boot_id=_read("/proc/sys/kernel/random/boot_id"), pid_ns=_pid_ns(),
        started=None if fields is None else fields[19])


def same_pid_space(me: Identity, host: str, boot_id: str | None, pid_ns: str | None) -> bool:
    """Whether a pid recorded with these facts names a process this one can see."""
    return me.host == host and me.boot_id == boot_id and me.pid_ns == pid_ns


def pid_alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` (in this PID namespace) is the live process that started at ``started``."""
    fields = _stat_fields(pid)
    if fields is None:
        if os.path.isdir("/proc/self"):
            return False  # /proc is there and has no such process
        try:  # no /proc (not Linux): ask the kernel
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, but another user's
            return True
        return True
    if fields[0] in ("Z", "X"):  # a zombie (killed, not reaped) or dying
        return False
    return started is None or fields[19] == started


def dead_here(me: Identity, owners: list[tuple[str, int, str, str | None, str | None, str | None]]
              ) -> list[str]:
    """The ids of the owners (id, pid, host, boot_id, pid_ns, proc_start) that are in this
    process's PID namespace and whose process is gone."""
    return [owner_id for owner_id, pid, host, boot_id, pid_ns, started in owners
        if same_pid_space(me, host, boot_id, pid_ns) and not pid_alive(pid, started)]
