"""Typed values: step results, input and output survive the store with their type."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs
import pytest
from helpers import PATIENCE, final_state

from memable import (
    Completed,
    Context,
    Engine,
    Failed,
    MetadataStatus,
    SerializationError,
    WorkflowFailed,
)


@attrs.frozen
class Order:
    id: int
    total: float


@dataclasses.dataclass(frozen=True)
class Invoice:
    id: int
    total: float


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


# (value, the annotation a typed function would declare for it)
VALUES = [
    pytest.param(Order(1, 9.5), Order, id="attrs"),
    pytest.param(Invoice(2, 12.25), Invoice, id="dataclass"),
    pytest.param(Colour.GREEN, Colour, id="enum"),
    pytest.param(
        datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=timezone(timedelta(hours=2))),
        datetime,
        id="aware-datetime",
    ),
    pytest.param(
        {"a": [1, 2.5, {"b": None}], "c": {"d": [True, "x", []]}},
        dict[str, Any],
        id="nested-list-dict",
    ),
    pytest.param(None, int | None, id="none"),
    pytest.param(True, bool, id="bool"),
    pytest.param(42, int, id="int"),
    pytest.param(2.5, float, id="float"),
    pytest.param("zwölf €", str, id="str"),
]
TYPING = pytest.mark.parametrize("annotated", [False, True], ids=["by-tag", "by-annotation"])


def _producer(value: Any, hint: Any, annotated: bool, calls: list[int]) -> Callable[[], Any]:
    """A step function returning ``value``; its return annotation is ``hint`` if annotated."""

    def produce():  # type: ignore[no-untyped-def]  # unannotated on purpose: the tag rebuilds
        calls.append(1)
        return value

    if annotated:
        produce.__annotations__["return"] = hint
    return produce


@pytest.fixture(params=["lambda", "open-file"])
def unstorable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """A value no converter can store, and the type name an error should give for it."""
    if request.param == "lambda":
        yield (lambda: 1), "function"
    else:
        with (tmp_path / "handle.txt").open("w") as handle:
            yield handle, "TextIOWrapper"


# ---------------------------------------------------------------------- step results


@pytest.mark.parametrize(("value", "hint"), VALUES)
@TYPING
def test_step_result_replays_equal_and_same_type(
    engine: Engine, value: Any, hint: Any, annotated: bool
) -> None:
    """A replayed step result equals the first run's and has its type; the step ran once."""
    calls: list[int] = []
    seen: list[Any] = []
    produce = _producer(value, hint, annotated, calls)

    def wf(ctx: Context) -> None:
        seen.append(ctx.step("value:v1").run(produce))

    engine.register("values", wf)
    engine.start()
    assert engine.invoke("values", instance_id="v-1").wait() == Completed()
    assert engine.resume("values", "v-1").wait() == Completed()

    first, replayed = seen
    assert first == value
    assert type(first) is type(value)
    assert replayed == first
    assert type(replayed) is type(first)
    assert calls == [1]


@pytest.mark.parametrize(("value", "hint"), VALUES)
@TYPING
def test_workflow_input_round_trips(
    engine: Engine, value: Any, hint: Any, annotated: bool
) -> None:
    """Every run of an instance gets its stored input back equal and of the same type."""
    seen: list[Any] = []

    def wf(ctx: Context, data):  # type: ignore[no-untyped-def]  # typed below, or not
        seen.append(data)
        seen.append(ctx.input)

    if annotated:
        wf.__annotations__["data"] = hint
    engine.register("inputs", wf)
    engine.start()
    assert engine.invoke("inputs", value, instance_id="i-1").wait() == Completed()
    assert engine.resume("inputs", "i-1").wait() == Completed()

    assert len(seen) == 4
    for got in seen:
        assert got == value
        assert type(got) is type(value)


@pytest.mark.parametrize(("value", "hint"), VALUES)
@TYPING
def test_workflow_output_round_trips(
    engine: Engine, value: Any, hint: Any, annotated: bool
) -> None:
    """``Invocation.result()`` equals what the workflow returned and has its type."""

    def wf(ctx: Context):  # type: ignore[no-untyped-def]  # typed below, or not
        return value

    if annotated:
        wf.__annotations__["return"] = hint
    engine.register("outputs", wf)
    engine.start()
    result = engine.invoke("outputs", instance_id="o-1").result()
    again = engine.invocation("outputs", "o-1").result()

    assert result == value
    assert type(result) is type(value)
    assert again == value
    assert type(again) is type(value)


def ship(ctx: Context, order: Order) -> Order:
    """A workflow with a typed input and output (string annotations, PEP 563)."""
    return ctx.step("reprice:v1").run(lambda: Order(order.id, order.total * 2))


def test_annotated_input_and_output_round_trip(engine: Engine) -> None:
    """``fn(ctx, order: Order) -> Order`` gets an Order in and gives an Order out."""
    engine.register("ship", ship)
    engine.start()
    inv = engine.invoke("ship", Order(7, 4.25), instance_id="s-1")

    assert inv.result() == Order(7, 8.5)
    assert type(inv.result()) is Order
    replayed = engine.resume("ship", "s-1").result()
    assert replayed == Order(7, 8.5)
    assert type(replayed) is Order


def _moment_or_none(ctx: Context, moment: Any = None) -> Any:
    return moment


def test_an_input_annotated_any_with_a_none_default_keeps_its_type(engine: Engine) -> None:
    """``fn(ctx, moment: Any = None)`` invoked with a datetime gets the datetime back:
    Python 3.10 resolves that annotation to ``Optional[Any]``, which the store took for a
    type to rebuild by and refused the value (a schedule's tick could not be its input)."""
    moment = datetime(2041, 3, 4, 5, 6, tzinfo=timezone.utc)
    engine.register("moment", _moment_or_none)
    engine.start()
    assert engine.invoke("moment", moment).result(timeout=10) == moment


def test_returns_overrides_the_annotation(engine: Engine) -> None:
    """``.returns(T)`` rebuilds the stored result as T, over the function's annotation."""
    seen: list[Any] = []

    def orders() -> list[Any]:  # too loose to rebuild Orders: alone, it is refused
        return [Order(3, 9.5)]

    def wf(ctx: Context) -> None:
        seen.append(ctx.step("typed:v1").returns(list[Order]).run(orders))
        ctx.step("loose:v1").run(orders)

    engine.register("override", wf)
    engine.start()
    state = engine.invoke("override", instance_id="r-1").wait()
    assert isinstance(state, Failed)
    assert state.message.startswith("step 'loose:v1' failed: SerializationError")
    assert "would not come back equal" in state.message
    assert engine.resume("override", "r-1").wait() == state

    assert seen == [[Order(3, 9.5)], [Order(3, 9.5)]]
    assert [type(v[0]) for v in seen] == [Order, Order]
    records = engine.steps("override", "r-1")
    assert [(r.key, r.state, r.attempts) for r in records] == [
        ("typed:v1", "completed", 1),
        ("loose:v1", "failed", 2),
    ]


def test_first_run_sees_the_value_as_replays_will(engine: Engine) -> None:
    """An int from a step annotated ``-> float`` is 0.0 on the first run as on replays."""
    seen: list[Any] = []

    def zero() -> float:
        return 0

    engine.register("wf", lambda ctx: seen.append(ctx.step("z").run(zero)))
    engine.start()
    assert engine.invoke("wf", instance_id="z-1").wait() == Completed()
    assert engine.resume("wf", "z-1").wait() == Completed()
    assert [(v, type(v)) for v in seen] == [(0.0, float), (0.0, float)]


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({1: "a"}, id="int-keys"),
        pytest.param([(1, 2)], id="tuple-in-list"),
        pytest.param({"at": datetime(2026, 1, 1, tzinfo=timezone.utc)}, id="datetime-in-dict"),
        pytest.param(float("nan"), id="nan"),
    ],
)
def test_values_that_would_change_in_the_store_are_refused(engine: Engine, value: Any) -> None:
    """A value JSON would not give back equal fails its step instead of replaying changed."""
    engine.register("wf", lambda ctx: ctx.step("lossy").run(lambda: value))
    engine.start()
    inv = engine.invoke("wf")
    state = inv.wait()
    assert isinstance(state, Failed)
    assert state.message.startswith("step 'lossy' failed: SerializationError")
    [record] = engine.steps("wf", inv.instance_id)
    assert (record.state, record.result) == ("failed", None)


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        pytest.param(UUID("12345678-1234-5678-1234-567812345678"), UUID, id="uuid"),
        pytest.param(Decimal("19.99"), Decimal, id="decimal"),
        pytest.param({1: "a"}, dict[int, str], id="int-keys-annotated"),
    ],
)
def test_more_values_round_trip(engine: Engine, value: Any, hint: Any) -> None:
    """UUID and Decimal store, and an annotation makes int dict keys storable."""
    seen: list[Any] = []

    def produce() -> Any:
        return value

    produce.__annotations__["return"] = hint
    engine.register("wf", lambda ctx: seen.append(ctx.step("v").run(produce)))
    engine.start()
    assert engine.invoke("wf", instance_id="v-1").wait() == Completed()
    assert engine.resume("wf", "v-1").wait() == Completed()
    assert seen == [value, value]
    assert type(seen[1]) is type(value)


def make_orders(calls: list[int]) -> list[Order]:
    """A step function whose (string) return annotation is the only source of its type."""
    calls.append(1)
    return [Order(1, 1.5), Order(2, 2.5)]


def test_string_annotations_resolve(engine: Engine) -> None:
    """A ``from __future__ import annotations`` return hint (``list[Order]``) types the replay."""
    assert make_orders.__annotations__["return"] == "list[Order]"  # really a string here
    calls: list[int] = []
    seen: list[Any] = []

    def wf(ctx: Context) -> None:
        seen.append(ctx.step("orders:v1").run(make_orders, calls))

    engine.register("orders", wf)
    engine.start()
    assert engine.invoke("orders", instance_id="so-1").wait() == Completed()
    assert engine.resume("orders", "so-1").wait() == Completed()

    first, replayed = seen
    assert replayed == first == [Order(1, 1.5), Order(2, 2.5)]
    assert [type(o) for o in replayed] == [Order, Order]
    assert calls == [1]


# ---------------------------------------------------------------------- unstorable values


def test_unstorable_step_result_fails_and_reruns_on_resume(
    engine: Engine, unstorable: tuple[Any, str]
) -> None:
    """An unstorable step result fails the run, is stored as failed, and runs again on resume."""
    value, type_name = unstorable
    outcomes = [value, "stored"]
    calls: list[int] = []
    caught: list[SerializationError] = []

    def produce():  # type: ignore[no-untyped-def]  # returns either outcome
        calls.append(1)
        return outcomes[len(calls) - 1]

    def wf(ctx: Context) -> str:
        try:
            return ctx.step("pack:v1").run(produce)
        except SerializationError as exc:
            caught.append(exc)
            raise

    engine.register("pack", wf)
    engine.start()
    state = engine.invoke("pack", instance_id="p-1").wait()

    assert isinstance(state, Failed)
    assert "'pack:v1'" in state.message
    assert "SerializationError" in state.message
    assert [exc.key for exc in caught] == ["pack:v1"]
    assert engine.get_metadata("pack", "p-1").status == MetadataStatus.Failed(state.message)
    [record] = engine.steps("pack", "p-1")
    assert (record.key, record.kind, record.state, record.result, record.attempts) == (
        "pack:v1", "step", "failed", None, 1,
    )
    assert record.completed_at is None
    assert type_name in record.error

    assert engine.resume("pack", "p-1").result() == "stored"
    assert calls == [1, 1]
    [record] = engine.steps("pack", "p-1")
    assert (record.key, record.state, record.result, record.attempts) == (
        "pack:v1", "completed", "stored", 2,
    )


def test_unstorable_input_raises_and_stores_nothing(
    engine: Engine, unstorable: tuple[Any, str]
) -> None:
    """An unstorable input makes ``invoke`` raise SerializationError keyed "input"; none stored."""
    value, _ = unstorable
    engine.register("takes", lambda ctx, data: None)
    engine.start()

    with pytest.raises(SerializationError) as info:
        engine.invoke("takes", value, instance_id="t-1")

    assert info.value.key == "input"
    assert engine.list_instances("takes") == []
    assert engine.get_metadata("takes", "t-1") is None


def test_unstorable_output_fails_the_workflow(
    engine: Engine, unstorable: tuple[Any, str]
) -> None:
    """A workflow returning an unstorable value ends Failed with a message naming "output"."""
    value, _ = unstorable
    engine.register("gives", lambda ctx: value)
    engine.start()
    inv = engine.invoke("gives", instance_id="g-1")

    state = inv.wait()
    assert isinstance(state, Failed)
    assert state.message.startswith("output failed: SerializationError")
    assert "SerializationError" in state.message
    with pytest.raises(WorkflowFailed) as info:
        inv.result()
    assert info.value.state == state
    assert engine.get_metadata("gives", "g-1").status == MetadataStatus.Failed(state.message)


# ---------------------------------------------------------------------- stored value, new type


@pytest.mark.parametrize("typed_by", ["annotation", "returns"])
def test_stored_value_that_no_longer_fits_fails_and_keeps_the_row(
    tmp_path: Path, typed_by: str
) -> None:
    """A stored result that no longer fits its type fails the run and leaves the row as it was."""
    path = tmp_path / "memable.db"
    old = Engine.open(path)
    try:
        old.register("label", lambda ctx: ctx.step("label:v1").run(lambda: "abc"))
        old.start()
        assert old.invoke("label", instance_id="l-1").result() == "abc"
        before = old.steps("label", "l-1")
    finally:
        old.close()

    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return 3

    def count_untyped():  # type: ignore[no-untyped-def]  # only .returns types it
        calls.append(1)
        return 3

    def wf(ctx: Context) -> None:
        if typed_by == "annotation":
            ctx.step("label:v1").run(count)
        else:
            ctx.step("label:v1").returns(int).run(count_untyped)

    new = Engine.open(path)
    try:
        new.register("label", wf)
        new.start()
        state = new.resume("label", "l-1").wait()

        assert isinstance(state, Failed)
        assert "'label:v1'" in state.message
        assert "SerializationError" in state.message
        assert new.steps("label", "l-1") == before
        assert calls == []
    finally:
        new.close()


# ---------------------------------------------------------------------- a class defined again


def make_point_class() -> type[Any]:
    """A function-local attrs class: each call makes a new class with the same qualified name."""
    @attrs.frozen
    class Point:
        x: int

    return Point


def test_a_class_defined_again_under_the_same_name_round_trips(
    make_engine: Callable[..., Engine],
) -> None:
    """Each run rebuilds its value as the class used in that run, not an older same-named one."""
    first, second = make_point_class(), make_point_class()
    assert first is not second
    current: list[type[Any]] = []
    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.step("p").run(lambda: current[0](x=1)))
    with engine:
        for n, cls in enumerate((first, second), 1):
            current[:] = [cls]
            inv = engine.invoke("wf")
            assert final_state(inv) == Completed(), f"the run with class #{n}"
            value = inv.result(timeout=PATIENCE)
            assert type(value) is cls
            assert value == cls(x=1)


# ---------------------------------------------------------------------- typed values across runs


@attrs.frozen
class _Order:
    id: int
    total: float


def test_a_resumed_run_decodes_its_stored_input_with_its_type(
    make_engine: Callable[..., Engine],
) -> None:
    """A resumed run (not the first) reads its input from the store, as the annotated class."""
    engine = make_engine()
    fail = [True]

    def wf(ctx: Context, order: _Order) -> str:
        ctx.step("a").run(lambda: order.id)
        if fail[0]:
            ctx.step("b").run(lambda: 1 / 0)
        return f"{order.id}: {order.total:.2f} ({type(order).__name__})"

    engine.register("wf", wf)
    with engine:
        first = engine.invoke("wf", _Order(7, 19.5), instance_id="x")
        assert isinstance(first.wait(timeout=10), Failed)
        fail[0] = False
        assert engine.resume("wf", "x").result(timeout=10) == "7: 19.50 (_Order)"


def test_a_step_that_returned_a_class_replays_it_as_that_class(
    make_engine: Callable[..., Engine],
) -> None:
    """The stored type tag, not a hint, rebuilds a step's attrs result on replay."""
    engine = make_engine()
    fail = [True]

    def wf(ctx: Context) -> str:
        order = ctx.step("make").run(lambda: _Order(4, 2.5))
        ctx.step("check").run(lambda: 1 / 0 if fail[0] else 1)
        return f"{type(order).__name__} {order.id}"

    engine.register("wf", wf)
    with engine:
        assert isinstance(engine.invoke("wf", instance_id="x").wait(timeout=10), Failed)
        fail[0] = False
        assert engine.resume("wf", "x").result(timeout=10) == "_Order 4"


def test_a_suspend_point_rebuilds_its_signal_as_the_class_it_returns(
    make_engine: Callable[..., Engine],
) -> None:
    """``ctx.suspend(key, returns=C)`` gives the run that goes on a C, not the stored dict,
    for a payload sent as plain JSON (as the command line sends it)."""
    engine = make_engine()

    def wf(ctx: Context) -> str:
        order = ctx.suspend("order", returns=_Order)
        return f"{type(order).__name__} {order.id}"

    engine.register("wf", wf)
    with engine:
        assert str(engine.invoke("wf", instance_id="x").wait(timeout=10)) == "suspended: order"
        signalled = engine.signal("wf", "x", "order", {"id": 3, "total": 1.5})
        assert signalled.result(timeout=10) == "_Order 3"
