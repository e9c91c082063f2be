"""A PostgreSQL server of a test's own, to crash and restart (not a test module).

``PgServer`` runs ``initdb`` into a temporary directory and starts the server on a
free loopback port; ``crash()`` stops it with ``pg_ctl stop -m immediate`` (what a
power cut leaves: no shutdown checkpoint, unflushed WAL gone) and ``start()`` brings
it back on the same port, through crash recovery. As root, every server command runs
as the ``postgres`` OS user (initdb and postgres refuse root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

#: Seconds to wait for the server to come up (or to go) before the test fails.
UP_WAIT = 60.0


def _version(bindir: str) -> tuple[int, ...]:
    name = Path(bindir).parent.name
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def find_bindir() -> str | None:
    """The directory of ``initdb`` and ``pg_ctl``: ``pg_config --bindir``, else the newest
    ``/usr/lib/postgresql/*/bin``; None if there is none."""
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if found.returncode == 0:
            candidates.append(found.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
    for bindir in candidates:
        if all(os.access(os.path.join(bindir, tool), os.X_OK)
               for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def bindir_or_skip() -> str:
    """The server binaries; skip the test without them, and under CI (CI=true) fail."""
    bindir = find_bindir()
    why = "no PostgreSQL server binaries (initdb, pg_ctl) for a server of the test's own"
    if bindir is not None and os.geteuid() == 0:
        try:  # as root the server runs as the postgres OS user
            pwd.getpwnam("postgres")
        except KeyError:
            bindir, why = None, "running as root, and no 'postgres' OS user to run a server as"
    if bindir is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why}; under CI the PostgreSQL cases must run")
        pytest.skip(why)
    return bindir


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PgServer:
    """One server in a temporary directory; ``close()`` stops it and removes the directory."""

    def __init__(self, bindir: str, settings: dict[str, str] | None = None) -> None:
        self._bindir = bindir
        self._settings = dict(settings or {})
        self.root = Path(tempfile.mkdtemp(prefix="memable-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as_postgres = os.geteuid() == 0
        try:
            if self._as_postgres:
                shutil.chown(self.root, "postgres", "postgres")
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "--no-sync", "-E", "UTF8")
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        command = [os.path.join(self._bindir, tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=UP_WAIT * 2,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stdout}{done.stderr}"
                               f"{self.server_log()}")
        return done

    def server_log(self) -> str:
        try:
            return "\n--- server log ---\n" + self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def start(self) -> None:
        """Start the server (after a crash: through recovery); return once it takes connections."""
        options = [f"-p {self.port}", f"-k {self.root}", "-c listen_addresses=127.0.0.1"]
        options += [f"-c {name}={value}" for name, value in self._settings.items()]
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w",
                  "-t", str(int(UP_WAIT)), "-o", " ".join(options), "start")
        self._wait_up()

    def _wait_up(self) -> None:
        import psycopg

        deadline = time.monotonic() + UP_WAIT
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=5).close()
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not come up{self.server_log()}") from exc
            time.sleep(0.1)  # a bounded wait for the server

    def crash(self) -> None:
        """Stop the server at once: no checkpoint, and WAL not yet flushed is lost."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        """Stop the server if it runs, and remove its directory."""
        pid_file = self.data / "postmaster.pid"
        try:
            if pid_file.exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            # pg_ctl could not stop it: kill the postmaster this server started, by its pid.
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(int(pid_file.read_text().splitlines()[0]), signal.SIGKILL)
            raise
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
