"""A TCP proxy a test can cut and heal: a network partition between an engine and its server.

Every connection accepted on ``port`` is forwarded to ``target``. ``cut()``
stops forwarding in both directions without closing anything (packets of a
partition are not answered; they are held here, as a network would delay
them), ``heal()`` delivers what was held and forwards again. ``drop()`` is the
server going away instead: every connection is closed at once and new ones are
closed as soon as accepted, until ``heal()``. ``connect_delay`` (seconds) holds
each new connection that long before it is forwarded: a slow network or a
loaded server. ``close()`` ends every connection
and joins every thread.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading


class Proxy:
    """Forwards 127.0.0.1:``port`` to ``target``; cut and healed by the test."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        # _lock guards _sockets, _threads and _down; _open is clear while cut.
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self._server]
        self._down = False  # set by drop(): connections are refused until heal()
        self.connect_delay = 0.0
        self._threads: list[threading.Thread] = []
        self._open = threading.Event()
        self._open.set()
        self._closing = threading.Event()
        self._start(self._accept, "proxy-accept")

    def _start(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        with self._lock:
            self._down = False
        self._open.set()

    def drop(self) -> None:
        """Close every connection now and refuse new ones until ``heal()``: the server is
        down (each side sees its connection reset)."""
        with self._lock:
            self._down = True
            sockets, self._sockets = self._sockets[1:], self._sockets[:1]
        for sock in sockets:
            _reset(sock)

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            # The client is registered in the same hold of _lock that finds the proxy
            # up, so a drop() from then on resets it; a drop() while the upstream
            # connection is made is seen when that is registered. (Checked apart from
            # the registration, a connection accepted just before a drop() was
            # forwarded after it: the server was reachable again.)
            with self._lock:
                down = self._down
                if not down:
                    self._sockets.append(client)
            if down:
                _reset(client)
                continue
            if self.connect_delay:  # a slow connection: its latency, nothing to wait for
                self._closing.wait(self.connect_delay)
            upstream = socket.create_connection(self._target)
            with self._lock:
                dropped = client not in self._sockets
                if not dropped:
                    self._sockets.append(upstream)
            if dropped:
                _reset(client)
                _reset(upstream)
                continue
            self._start(self._pump, "proxy-up", client, upstream)
            self._start(self._pump, "proxy-down", upstream, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        held = b""
        while not self._closing.is_set():
            if self._open.is_set() and held:
                try:
                    sink.sendall(held)
                except OSError:
                    return
                held = b""
            try:
                ready, _, _ = select.select([source], [], [], 0.05)
            except (OSError, ValueError):
                return
            if ready:
                try:
                    data = source.recv(65536)
                except OSError:
                    return
                if not data:
                    if not held:
                        with contextlib.suppress(OSError):
                            sink.shutdown(socket.SHUT_WR)
                        return
                    # The peer closed; what is held still goes once healed.
                    self._open.wait()
                    continue
                held += data

    def close(self) -> None:
        self._closing.set()
        self._open.set()
        # Closing a listening socket does not wake a thread blocked in its accept();
        # shutting it down does (accept() fails with EINVAL).
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in threads:
            thread.join(10)
        alive = [thread.name for thread in threads if thread.is_alive()]
        assert not alive, f"the proxy's threads outlived close(): {alive}"


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (RST), as a server that went away leaves it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
