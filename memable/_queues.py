"""Queue declarations (``engine.queue``) and which of them an engine consumes. No I/O.

Each consuming engine enforces the limits when it claims (``memable._store.sql.queues``):
``concurrency`` counts the queue's running instances across engines, ``per_process`` this
engine's, ``rate`` the claims in the last ``period`` seconds, ``per_key`` each
``concurrency_key``'s."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import attrs
import cattrs

from ._validate import positive_seconds


def _positive_int(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} is a positive int or None, not {value!r}")
    return value


def _rate(value: object) -> tuple[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 2:
        raise ValueError(f"rate is (count, period), not {value!r}")
    count, period = value
    try:
        seconds = positive_seconds(period, "rate period")
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    checked = _positive_int(count, "rate count")
    assert checked is not None
    return checked, seconds


@attrs.frozen
class QueueSpec:
    """One declared queue and its limits (None: unlimited).

    >>> QueueSpec.declare("payments", concurrency=5, rate=(100, 60))
    QueueSpec(name='payments', concurrency=5, per_process=None, rate=(100, 60.0), per_key=None)
    >>> QueueSpec.declare("payments", rate=(100, "1m"))
    Traceback (most recent call last):
    ...
    ValueError: rate period is float seconds or a timedelta, not str '1m'
    """

    name: str
    concurrency: int | None = None
    per_process: int | None = None
    rate: tuple[int, float] | None = None
    per_key: int | None = None

    @classmethod
    def declare(
        cls, name: str, *, concurrency: int | None = None, per_process: int | None = None,
        rate: tuple[int, float | timedelta] | None = None, per_key: int | None = None,
    ) -> QueueSpec:
        """Check a declaration: a name, positive ints, a (positive int, positive duration)."""
        return cls(check_queue_name(name), _positive_int(concurrency, "concurrency"),
            _positive_int(per_process, "per_process"), _rate(rate),
            _positive_int(per_key, "per_key"))


def check_queue_name(name: object) -> str:
    """A queue name is a non-empty ``str``.

    >>> check_queue_name("")
    Traceback (most recent call last):
    ...
    ValueError: a queue name is a non-empty str, not ''
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a queue name is a non-empty str, not {name!r}")
    return name


def check_consumed(queues: object) -> tuple[str, ...] | None:
    """The ``queues`` option: None (every declared queue), or the names to consume.

    >>> check_consumed(None), check_consumed(()), check_consumed(["a", "b"])
    (None, (), ('a', 'b'))
    >>> check_consumed("ab")
    Traceback (most recent call last):
    ...
    TypeError: queues is None or a list of queue names, not 'ab'
    """
    if queues is None:
        return None
    if isinstance(queues, str) or not isinstance(queues, Iterable):
        raise TypeError(f"queues is None or a list of queue names, not {queues!r}")
    return tuple(check_queue_name(name) for name in queues)


def consumed(declared: dict[str, QueueSpec], names: tuple[str, ...] | None) -> list[QueueSpec]:
    """The declared queues an engine consumes; ``ValueError`` for a name not declared.

    >>> specs = {"a": QueueSpec("a"), "b": QueueSpec("b")}
    >>> [q.name for q in consumed(specs, None)], consumed(specs, ())
    (['a', 'b'], [])
    """
    if names is None:
        return list(declared.values())
    unknown = sorted(set(names) - set(declared))
    if unknown:
        raise ValueError(f"queues {unknown!r} are not declared (engine.queue(name, ...))")
    return [declared[name] for name in names]


def check_priority(priority: Any) -> int:
    """A priority is an int; lower runs first.

    >>> check_priority(True)
    Traceback (most recent call last):
    ...
    TypeError: priority is an int, not True
    """
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority is an int, not {priority!r}")
    return priority


@attrs.frozen
class Declarations:
    """What one engine runs (its workflows, consumed queues, and schedules as ``[cron, zone]``),
    stored with its owner row as JSON for tools to read.

    >>> import json
    >>> declared = Declarations(["charge"], [QueueSpec("payments", concurrency=2)])
    >>> text = declared.to_json()
    >>> json.loads(text)["queues"][0]
    {'name': 'payments', 'concurrency': 2, 'per_process': None, 'rate': None, 'per_key': None}
    >>> Declarations.from_json(text) == declared, Declarations.from_json(None)
    (True, None)
    """

    workflows: list[str]
    queues: list[QueueSpec]
    schedules: dict[str, list[str]] = attrs.Factory(dict)

    def to_json(self) -> str:
        return json.dumps(_CONVERTER.unstructure(self))

    @staticmethod
    def from_json(text: str | None) -> Declarations | None:
        """The declarations stored as ``text``; None for none (or unreadable ones)."""
        if text is None:
            return None
        try:
            return _CONVERTER.structure(json.loads(text), Declarations)
        except (ValueError, TypeError, cattrs.BaseValidationError):
            return None

    @staticmethod
    def all_of(texts: Iterable[str | None]) -> list[Declarations]:
        """The readable declarations of ``texts``."""
        return [declared for declared in map(Declarations.from_json, texts) if declared]


_CONVERTER = cattrs.Converter()
