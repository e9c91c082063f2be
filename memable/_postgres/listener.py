"""Wake-ups across hosts: one connection per engine LISTENs on its store's channel.

A transaction storing a signal, a cancel or a timer NOTIFYs (``pg_notify``: only a commit
sends it); the listener hands other engines' notices to the runner's ``Changed``. A
transaction-mode pooler (PgBouncer) loses every notice, so the listener probes itself after
each LISTEN and, unheard within ``PROBE_WAIT`` s, warns once: the poll carries on alone.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from .._log import log
from .schema import quote_ident

#: ``changed(kind, workflow, instance_id)``, e.g. "signal"; "poll" (no workflow, id): look at all.
Changed = Callable[[str, "str | None", "str | None"], None]
#: NOTIFY payloads must stay under 8000 bytes; a longer one names no instance.
MAX_PAYLOAD = 7900


def payload(kind: str, sender: str, workflow: str | None, instance_id: str) -> str:
    """The NOTIFY text for a change to one instance (a "queued" one may name a queue:
    workflow None, and the queue's name).

    >>> payload("signal", "e1", "wf", "i-1")
    '["signal", "e1", "wf", "i-1"]'
    >>> payload("cancel", "e1", "wf", "x" * 9000)
    '["poll", "e1", null, null]'
    """
    text = json.dumps([kind, sender, workflow, instance_id])
    if len(text.encode()) > MAX_PAYLOAD:
        return json.dumps(["poll", sender, None, None])
    return text


def parse(text: str, me: str) -> tuple[str, str | None, str | None] | None:
    """(kind, workflow, instance_id) of a notice from another engine; None for our own.

    >>> parse('["signal", "e2", "wf", "i-1"]', "e1")
    ('signal', 'wf', 'i-1')
    >>> parse('["signal", "e1", "wf", "i-1"]', "e1") is None
    True
    >>> parse("garbage", "e1")
    ('poll', None, None)
    """
    try:
        kind, sender, workflow, instance_id = json.loads(text)
    except (ValueError, TypeError):
        return ("poll", None, None)
    if sender == me:
        return None
    return (str(kind), workflow, instance_id)


class Listener(threading.Thread):
    """A daemon thread per started engine on a PostgreSQL store: it holds nothing that must
    finish (the poll finds a lost notice), so a program that forgets ``stop()`` still exits."""

    #: Seconds between looks at the stop flag while no notice comes.
    TICK = 0.25
    #: Seconds within which the listener must hear its own probe.
    PROBE_WAIT = 5.0

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], channel: str, me: str,
                 changed: Changed, probe: Callable[[str], None]) -> None:
        super().__init__(name="memable-listen", daemon=True)
        self._connect = connect
        self._channel = channel
        self._me = me
        self._changed = changed
        self._probe = probe
        # Set once, by stop(); waits between reconnects end at once.
        self._stopping = threading.Event()
        self._warned = False  # a connection problem was logged and not yet healed
        #: Set when a probe came back (notices arrive), or when one did not (warned).
        self.heard = threading.Event()
        self.unheard = threading.Event()

    def stop(self) -> None:
        """Stop listening and wait for the thread to end; idempotent."""
        self._stopping.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join()

    def run(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            try:
                self._listen()
                return  # stopping
            except psycopg.errors.FeatureNotSupported as exc:
                log.warning("cannot LISTEN on the store (%s); relying on the poll alone", exc)
                return
            except Exception as exc:  # the connection went: try again, poll meanwhile
                if not self._warned:
                    # One line: psycopg's messages run on over several.
                    log.warning("lost the store's notification connection (%s); "
                                "reconnecting, polling meanwhile",
                                (str(exc).strip().splitlines() or [type(exc).__name__])[0])
                    self._warned = True
            self._stopping.wait(delay)
            delay = min(delay * 2, 5.0)

    def _listen(self) -> None:
        with self._connect() as conn:
            conn.execute(f"LISTEN {quote_ident(self._channel)}")
            if self._warned:
                log.info("listening to the store again")
                self._warned = False
            # Whatever was notified while nobody listened: look at the store now.
            self._tell("poll", None, None)
            probe = self._send_probe()
            deadline = time.monotonic() + self.PROBE_WAIT
            while not self._stopping.is_set():
                for notice in conn.notifies(timeout=self.TICK):
                    if notice.payload == probe:
                        probe = None
                        self.heard.set()
                        continue
                    found = parse(notice.payload, self._me)
                    if found is not None and found[0] != "probe":  # another engine's
                        self._tell(*found)
                if probe is not None and time.monotonic() > deadline:
                    probe = None
                    self._unheard()

    def _send_probe(self) -> str | None:
        """Notify ourselves through the store's connections; the text to listen for."""
        text = payload("probe", self._me, "", uuid.uuid4().hex)
        try:
            self._probe(text)
        except Exception as exc:  # the store is unreachable: the reconnects say so
            log.debug("could not send the notification probe (%s)", exc)
            return None
        return text

    def _unheard(self) -> None:
        """The probe never came back: LISTEN is accepted but loses every notice."""
        if not self.unheard.is_set():
            log.warning("notices from the store do not arrive on the listening connection "
                        "(a transaction-mode pooler such as PgBouncer?); relying on the poll")
        self.unheard.set()

    def _tell(self, kind: str, workflow: str | None, instance_id: str | None) -> None:
        try:
            self._changed(kind, workflow, instance_id)
        except Exception:  # the engine's to report; listening goes on
            log.exception("acting on a notice from another engine failed")
