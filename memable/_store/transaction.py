"""The transaction interface: what a transaction body needs of a store, and nothing else.

Each guarantee a store gives (``memable._store.sql``: create, claim, step
write, suspend, signal, timer, cancel, finish, queue claim, children, tick,
fork, retention, owners and leases) is one function of a ``Transaction``,
written once. Both stores implement the interface, each on its own
connection, and so can a connection an application hands in.

A body runs statements (``execute``; ``execute_each`` for several whose rows
it reads, in one round trip where the store can; ``write`` for one whose
result it does not read, which may share the next one's round trip), locks
an instance's row before it decides on it (``lock_instance``), and tells
other engines of a change (``notify``: sent when the transaction commits,
and never if it rolls back; ``relax_commit`` for a write a crash may undo).
Statements name their parameters ``:name``; the few words each dialect
spells differently are written ``{word}`` (see ``Dialect``) and spelled by
the transaction.

Atomicity is the store's: a body runs inside one transaction, and refuses
its write by raising an ``EngineError`` or a control exception
(``LostInstance``, ``RunCancelled``), which undoes every statement it ran.

>>> SQLITE.spell("SELECT 1 FROM instances WHERE owner = :me{for_update}")
'SELECT 1 FROM instances WHERE owner = :me'
>>> POSTGRESQL.spell("SELECT 1 FROM instances WHERE owner = :me{for_update}")
'SELECT 1 FROM instances WHERE owner = %(me)s FOR UPDATE'
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
    """How one SQL dialect spells what the two stores' dialects spell differently.

    SQLite serialises writers database-wide, so its transactions need no row
    locks: each locking clause is empty there. Leases are judged by the
    store's clock: on SQLite the engine's (the ``:now`` parameter, seconds
    since the epoch), on PostgreSQL the server's, so hosts whose clocks
    differ agree.
    """

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
    #: Whether the database locks rows, not the whole store (PostgreSQL): a body
    #: locks what it decides by, and what it cannot know before it reads (a queue's
    #: next instances) by a lock of its own. SQLite serialises writers database-wide.
    row_locks: bool = False
    #: Whether a statement takes a list as one parameter (an array): a batch of rows is
    #: then one statement (``unnest``), else one statement per row.
    array_parameters: bool = False

    def spell(self, template: str) -> str:
        """``template`` in this dialect: its ``{word}`` spelled, its parameters named.

        Cached by text: a body's statements are constants, spelled once. A statement
        built per call (an ``IN`` list of a purge's batch) is spelled too; the cache
        starts again once it holds ``SPELLED`` texts, so it never grows without bound.
        """
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
    "sqlite", for_update="", for_share="", skip_locked="", share_skip_locked="",
    now_epoch=":now",
)
POSTGRESQL = Dialect(
    "postgresql", for_update=" FOR UPDATE", for_share=" FOR SHARE",
    skip_locked=" FOR UPDATE SKIP LOCKED", share_skip_locked=" FOR SHARE SKIP LOCKED",
    now_epoch="extract(epoch FROM clock_timestamp())::double precision",
    parameter="%%(%s)s", row_locks=True, array_parameters=True,
)


class Cursor(Protocol):
    """What a statement gives back: its rows, and how many it changed."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    @property
    def description(self) -> Any:
        """The columns of the rows read: each a sequence whose first item is the name."""
        ...


class Transaction(Protocol):
    """One open transaction of a store, as a body sees it (see the module docstring)."""

    #: How the store's SQL spells what differs between dialects.
    dialect: Dialect
    #: The engine this transaction writes for: its owner id (``liveness.owner_id``).
    owner: str

    def execute(self, template: str, params: Mapping[str, Any] | None = None) -> Cursor:
        """Run one statement (``:name`` parameters, ``{word}`` spellings) in this
        transaction."""
        ...

    def executemany(self, template: str, params: Iterable[Mapping[str, Any]]) -> None:
        """Run one statement once per set of parameters, in this transaction."""
        ...

    def execute_each(self, *statements: tuple[str, Mapping[str, Any]]) -> list[list[Any]]:
        """Run each ``(template, params)`` in order, in this transaction, and give each
        one's rows (none for a statement that reads none): in one round trip where the
        store can. Each statement still sees what those before it did, and what
        committed before it began: a lock taken by one holds for those after it (and
        a body that then refuses raises, which undoes them)."""
        ...

    def write(self, template: str, params: Mapping[str, Any]) -> None:
        """Run one statement whose result the body does not read, in this transaction.

        The store may send it with the transaction's next statement (or its
        commit), in one round trip, in order: only for a statement that fails
        only when the store does (no constraint it may break, nothing the body
        would catch).
        """
        ...

    def lock_instance(self, workflow: str, instance_id: str) -> tuple[str, str | None] | None:
        """The instance's ``(status, owner)``, its row locked until this transaction ends
        (no other writer changes it meanwhile); None when there is no such instance."""
        ...

    def notify(self, kind: str, workflow: str | None, instance_id: str | None) -> None:
        """Tell the engines watching this store of ``kind`` of change (``"signal"``,
        ``"cancel"``, ``"timer"``, ``"queued"``) to one instance (a ``"queued"`` one may
        name a queue: workflow None, the queue's name), once this transaction commits."""
        ...

    def relax_commit(self) -> None:
        """Let this transaction commit without waiting for its flush to disk (where the
        store can), for a write that a crash may undo without harm: only a suspension
        that goes on at once (it changes no owner or status; the run's next write
        commits durably and, the log being one sequence, makes it durable too)."""
        ...


#: A row's status and owner, the locked read every decision about an instance starts from.
LOCK_INSTANCE = (
    "SELECT status, owner FROM instances WHERE workflow = :workflow "
    "AND instance_id = :instance_id{for_update}"
)
