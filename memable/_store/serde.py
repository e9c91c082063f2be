"""One cattrs converter between user values and the JSON text the store keeps.

A stored value is JSON text and a type tag naming its class (None for what JSON rebuilds by
itself: dict, list, str, int, float, bool, None). On the way back the type is, in order: an
explicit ``returns``, the function's return annotation, the tag. The first run gets the value
back as rebuilt, so it sees what every replay sees (an ``int`` 0 from a step annotated
``-> float`` is ``0.0``). A value that would not come back equal is refused, not mangled:
``{1: "a"}`` without an annotation (JSON keys are strings) raises SerializationError."""

from __future__ import annotations

import inspect
import json
import sys
import threading
import typing
import weakref
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from uuid import UUID

from cattrs.preconf.json import make_converter

from .._errors import SerializationError

converter = make_converter()
converter.register_unstructure_hook(UUID, str)
converter.register_structure_hook(UUID, lambda value, _: UUID(value))
converter.register_unstructure_hook(Decimal, str)
converter.register_structure_hook(Decimal, lambda value, _: Decimal(value))

#: What a message about a value that cannot be stored says to do.
HOW_TO_STORE = (
    "to store it, make it an attrs class or a dataclass, or plain JSON types (dict, list, "
    "str, int, float, bool, None), and name its type with .returns(T) or an annotation "
    "if it must come back as another")

#: Types JSON rebuilds exactly, so they need no tag.
_NATIVE: frozenset[type] = frozenset({dict, list, str, int, float, bool, type(None)})

# Classes stored, by tag, so function-local ones (no import reaches them) rebuild in this
# process. Written under _types_lock when a tag's class changes; read on every tagged decode.
_types_lock = threading.Lock()
_types_by_tag: dict[str, type] = {}


def _tag_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _type_for_tag(tag: str) -> type:
    cls = _types_by_tag.get(tag)
    if cls is not None:
        return cls
    module_name, _, qualname = tag.partition(":")
    # Only imported modules: a tag read from a store must not import (run) arbitrary code.
    obj: Any = sys.modules.get(module_name)
    if obj is None:
        raise TypeError(f"class {tag} is stored, but module {module_name!r} is not imported; "
            "import it, or give the type with an annotation or .returns()")
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{tag} is not a class")
    with _types_lock:
        _types_by_tag[tag] = obj
    return obj


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def encode(value: Any) -> tuple[str, str | None]:
    """Turn ``value`` into (JSON text, type tag); raise TypeError/ValueError if it cannot."""
    cls = type(value)
    if cls in _NATIVE:
        tag = None
    else:
        tag = _tag_of(cls)
        # The latest class under a tag wins: a function-local class made anew rebuilds as itself.
        if _types_by_tag.get(tag) is not cls:
            with _types_lock:
                _types_by_tag[tag] = cls
    if tag is None:
        # The common case: the C encoder alone. store_form's check catches what JSON changes.
        try:
            return _dumps(value), None
        except TypeError:  # something inside needs the converter
            pass
    return _dumps(converter.unstructure(value)), tag


# json.loads's C scanner, minus whitespace regexes (our own dumps): replay's per-step decode.
_scan: Callable[[str, int], tuple[Any, int]] = (
    json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__, untyped
)
_SCALARS = frozenset({str, int, float, bool})


def _builder(hint: Any) -> Callable[[Any], Any]:
    """How to rebuild JSON data as ``hint``: cattrs' hook, or as is where JSON already is."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SCALARS or hint in (dict, list):
        hook = converter.get_structure_hook(hint)
        # JSON gives an exact str/bool/dict/list; an int meant as a float (or back) takes the hook.
        return lambda data: data if type(data) is hint else hook(data, hint)
    if origin in (dict, list) and all(arg is Any for arg in args[1:] or args) and (
        origin is list or args[0] is str
    ):
        hook = converter.get_structure_hook(hint)
        return lambda data: data if type(data) is origin else hook(data, hint)
    hook = converter.get_structure_hook(hint)
    return lambda data: hook(data, hint)


# Builders by type hint; hints are hashable and few. Written under _types_lock.
_builders: dict[Any, Callable[[Any], Any]] = {}


def decode(text: str, tag: str | None, hint: Any = None) -> Any:
    """Rebuild a stored value: by ``hint`` when given, else by its tag."""
    data = _scan(text, 0)[0]
    if hint is None or hint is Any or hint is object or _holds_any(hint):  # use the tag
        if tag is None:
            return data
        hint = _type_for_tag(tag)
    try:
        build = _builders[hint]
    except KeyError:
        build = _builder(hint)
        with _types_lock:
            _builders[hint] = build
    except TypeError:  # an unhashable hint: no cache
        return converter.structure(data, hint)
    return build(data)


def _holds_any(hint: Any) -> bool:
    """A union one of whose members is ``Any``: no type to go by either (Python 3.10
    resolves ``x: Any = None`` to ``Optional[Any]``; 3.11 and later to ``Any``)."""
    return typing.get_origin(hint) is typing.Union and Any in typing.get_args(hint)


def _where(key: str) -> dict[str, str]:
    # "input" and "output" are parts of the instance, not step keys.
    return {"part": key} if key in ("input", "output") else {"key": key}


def store_form(
    workflow: str, instance_id: str | None, key: str, value: Any, hint: Any = None
) -> tuple[str, str | None, Any]:
    """Encode ``value`` for the store; return (JSON text, tag, the value as rebuilt), or raise
    SerializationError naming where it was going if it cannot be stored or come back equal."""
    try:
        text, tag = encode(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        if inspect.isawaitable(value):  # a plain function handing back async work
            raise SerializationError(
                f"cannot store a {type(value).__qualname__}: the function returned an "
                "awaitable that nothing awaits, and memable runs plain synchronous functions; "
                "await it inside one with asyncio.run() and return its value", workflow=workflow,
                instance_id=instance_id, **_where(key)) from None
        raise SerializationError(
            f"cannot store a value of type {type(value).__qualname__} ({exc}); {HOW_TO_STORE}",
            workflow=workflow, instance_id=instance_id, **_where(key)) from exc
    try:
        rebuilt = decode(text, tag, hint)
        same = bool(rebuilt == value)
    except Exception as exc:
        same, rebuilt = False, exc
    if not same:
        raise SerializationError(f"a {type(value).__qualname__} would not come back equal "
            f"(stored as {text[:60]}, rebuilt as {rebuilt!r:.60}); give its type with a return "
            "annotation or .returns()", workflow=workflow, instance_id=instance_id, **_where(key))
    return text, tag, rebuilt


def decode_for(
    workflow: str, instance_id: str, key: str, text: str, tag: str | None, hint: Any = None
) -> Any:
    """``decode``, raising SerializationError that names the stored value it failed on."""
    try:
        return decode(text, tag, hint)
    except Exception as exc:
        raise SerializationError(
            f"stored value does not fit its type {hint or tag} ({type(exc).__name__}: {exc})",
            workflow=workflow, instance_id=instance_id, **_where(key)) from exc


# Resolved annotations, weakly keyed to keep no closure alive. Written under _hints_lock.
_hints_lock = threading.Lock()
_hints_cache: weakref.WeakKeyDictionary[Callable[..., Any], dict[str, Any]] = (
    weakref.WeakKeyDictionary())


def hints_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of ``fn``; {} where there are none."""
    # A bound method is a new object at every access: key on the function underneath.
    fn = getattr(fn, "__func__", fn)
    if not getattr(fn, "__annotations__", None):
        return {}  # lambdas and unannotated functions: nothing to resolve
    try:
        cached = _hints_cache.get(fn)  # a lone dict lookup: safe without the lock
    except TypeError:  # not weakly referenceable: resolve without caching
        cached = None
    if cached is not None:
        return cached
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references
        hints = {}
    try:
        with _hints_lock:
            _hints_cache[fn] = hints
    except TypeError:
        pass
    return hints


def return_hint(fn: Callable[..., Any]) -> Any:
    """The return annotation of ``fn``, or None when it has none (``-> None`` included)."""
    hint = hints_of(fn).get("return")
    return None if hint is type(None) else hint
