"""The transaction interface: what a transaction body needs of a store, and nothing else.

Each guarantee a store gives (``memable._store.sql``) is one function of a ``Transaction``,
written once; both stores implement it, and so can a connection an application hands in.
Parameters are ``:name``; words the dialects spell differently are ``{word}`` (``Dialect``).
A body refuses its write by raising an ``EngineError`` or a control exception
(``LostInstance``, ``RunCancelled``), which undoes every statement it ran.

>>> SQLITE.spell("SELECT 1 FROM memable_instances WHERE owner = :me{for_update}")
'SELECT 1 FROM memable_instances WHERE owner = :me'
>>> POSTGRESQL.spell("SELECT 1 FROM memable_instances WHERE owner = :me{for_update}")
'SELECT 1 FROM memable_instances WHERE owner = %(me)s FOR UPDATE'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import attrs

#: The words a statement writes ``{word}``, and what each dialect makes of them.
_WORD = re.compile(r"\{(for_update|for_share|skip_locked|share_skip_locked|now_epoch)\}")

#: How many spelled statements a dialect keeps (see ``Dialect.spell``).
SPELLED = 4096


@attrs.frozen
class Dialect:
    """How one SQL dialect spells what the two stores' dialects spell differently. SQLite
    serialises writers, so its locking clauses are empty. Leases are judged by the store's
    clock: SQLite's ``:now`` (the engine's), PostgreSQL's server's, so hosts agree."""

    name: str
    #: After a ``SELECT``: lock the rows read against writers until commit.
    for_update: str
    #: After a ``SELECT``: keep the rows read from changing until commit.
    for_share: str
    #: After a ``SELECT``: lock the rows read, passing over rows another transaction holds.
    skip_locked: str
    #: After a ``SELECT``: share-lock the rows read, passing over rows locked for update.
    share_skip_locked: str
    #: Seconds since the epoch by the clock leases are judged by.
    now_epoch: str
    #: How a statement writes its named parameter ``name``: ``%s`` formats the name.
    parameter: str = ":%s"
    _spelled: dict[str, str] = attrs.field(factory=dict, eq=False, repr=False)
    #: Whether the database locks rows (PostgreSQL): a body locks what it decides by, and what
    #: it cannot know before it reads (a queue's next instances) by a lock of its own.
    row_locks: bool = False
    #: Whether a list is one parameter (an array): a batch of rows is then one ``unnest``.
    array_parameters: bool = False

    def spell(self, template: str) -> str:
        """``template`` in this dialect: its ``{word}`` spelled, its parameters named. Cached
        by text; the cache starts again at ``SPELLED`` texts, so statements built per call (a
        purge batch's ``IN`` list) never grow it without bound."""
        text = self._spelled.get(template)
        if text is None:
            if len(self._spelled) >= SPELLED:
                self._spelled.clear()
            text = _WORD.sub(lambda m: str(getattr(self, m[1])), template)
            if self.parameter != ":%s":
                # ``:name`` parameters, never ``::type`` casts.
                text = re.sub(r"(?<![:\w]):(\w+)", lambda m: self.parameter % m[1], text)
            self._spelled[template] = text
        return text


SQLITE = Dialect(
    "sqlite", for_update="", for_share="", skip_locked="", share_skip_locked="", now_epoch=":now")
POSTGRESQL = Dialect("postgresql", for_update=" FOR UPDATE", for_share=" FOR SHARE",
    skip_locked=" FOR UPDATE SKIP LOCKED", share_skip_locked=" FOR SHARE SKIP LOCKED",
    now_epoch="extract(epoch FROM clock_timestamp())::double precision", parameter="%%(%s)s",
    row_locks=True, array_parameters=True)


class Cursor(Protocol):
    """What a statement gives back: its rows, and how many it changed."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    @property
    def description(self) -> Any:
        """The columns of the rows read: each a sequence whose first item is the name."""


class Transaction(Protocol):
    """One open transaction of a store, as a body sees it (see the module docstring)."""

    #: How the store's SQL spells what differs between dialects.
    dialect: Dialect
    #: The engine this transaction writes for: its owner id (``liveness.owner_id``).
    owner: str

    def execute(self, template: str, params: Mapping[str, Any] | None = None) -> Cursor:
        """Run one statement (``:name`` parameters, ``{word}`` spellings) in this transaction."""

    def executemany(self, template: str, params: Iterable[Mapping[str, Any]]) -> None:
        """Run one statement once per set of parameters, in this transaction."""

    def execute_each(
        self, *statements: tuple[str, Mapping[str, Any]], last: bool = False
    ) -> list[list[Any]]:
        """Run each ``(template, params)`` in order and give each one's rows, in one round trip
        where the store can. Each sees what those before it did and what committed before it
        began: a lock taken by one holds for those after it.

        ``last``: the body's last statements, which the store may commit with in that round
        trip; a lost commit answer then runs the whole body again, so only for a body whose
        second run answers as the first (it changes no owner or status), or whose caller
        reads the store when the second says the first did nothing (``finish``)."""

    def write(self, template: str, params: Mapping[str, Any]) -> None:
        """Run one statement whose result the body does not read, in this transaction. The
        store may send it with the next statement (or the commit), in one round trip, in order:
        only for one that fails only when the store does (no constraint it may break)."""

    def lock_instance(self, workflow: str, instance_id: str) -> tuple[str, str | None] | None:
        """The instance's ``(status, owner)``, its row locked until this transaction ends
        (no other writer changes it meanwhile); None when there is no such instance."""

    def notify(self, kind: str, workflow: str | None, instance_id: str | None) -> None:
        """Tell the engines watching this store of ``kind`` of change (``"signal"``,
        ``"cancel"``, ``"timer"``, ``"queued"``) to one instance (a ``"queued"`` one may
        name a queue: workflow None, the queue's name), once this transaction commits. In an
        operation of single statements (no transaction), a notice asked before the first goes
        with it, in its transaction; one asked after a statement goes alone."""

    def relax_commit(self) -> None:
        """Commit without waiting for the flush to disk (where the store can), for a write a
        crash may undo harmlessly: only a suspension that goes on at once (no owner or status
        changes; the run's next durable commit makes it durable too, the log being one)."""


#: A row's status and owner, the locked read every decision about an instance starts from.
LOCK_INSTANCE = (
    "SELECT status, owner FROM memable_instances WHERE workflow = :workflow "
    "AND instance_id = :instance_id{for_update}"
)
