"""One cattrs converter between user values and the JSON text the store keeps.

A stored value is a pair: the JSON text, and a type tag naming the class the
value had when it was stored (None for values JSON rebuilds by itself: dict,
list, str, int, float, bool, None). On the way back the type is, in order:
an explicit ``returns``, the function's return annotation, the tag.
"""

from __future__ import annotations

import functools
import importlib
import json
import threading
import typing
from collections.abc import Callable
from typing import Any

from cattrs.preconf.json import make_converter

from ._errors import SerializationError

converter = make_converter()

#: Types JSON rebuilds exactly, so they need no tag.
_NATIVE: frozenset[type] = frozenset({dict, list, str, int, float, bool, type(None)})

# Classes seen when storing, by tag, so that classes defined inside functions
# (which no import can reach) still rebuild in this process. Guarded by
# _types_lock; written rarely (once per class), read on every tagged decode.
_types_lock = threading.Lock()
_types_by_tag: dict[str, type] = {}


def _tag_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _type_for_tag(tag: str) -> type:
    cls = _types_by_tag.get(tag)
    if cls is not None:
        return cls
    module_name, _, qualname = tag.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{tag} is not a class")
    with _types_lock:
        _types_by_tag[tag] = obj
    return obj


def encode(value: Any) -> tuple[str, str | None]:
    """Turn ``value`` into (JSON text, type tag); raise TypeError/ValueError if it cannot."""
    cls = type(value)
    if cls in _NATIVE:
        tag = None
    else:
        tag = _tag_of(cls)
        if tag not in _types_by_tag:
            with _types_lock:
                _types_by_tag[tag] = cls
    text = json.dumps(converter.unstructure(value), ensure_ascii=False, separators=(",", ":"))
    return text, tag


def decode(text: str, tag: str | None, hint: Any = None) -> Any:
    """Rebuild a stored value: by ``hint`` when given, else by its tag."""
    data = json.loads(text)
    if hint is None or hint is Any:
        if tag is None:
            return data
        hint = _type_for_tag(tag)
    return converter.structure(data, hint)


def encode_for(
    workflow: str, instance_id: str | None, key: str, value: Any
) -> tuple[str, str | None]:
    """``encode``, raising SerializationError that names where the value was going."""
    try:
        return encode(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise SerializationError(
            f"cannot store a value of type {type(value).__qualname__} ({exc})",
            workflow=workflow,
            instance_id=instance_id,
            key=key,
        ) from exc


def decode_for(
    workflow: str, instance_id: str, key: str, text: str, tag: str | None, hint: Any = None
) -> Any:
    """``decode``, raising SerializationError that names the stored value it failed on."""
    try:
        return decode(text, tag, hint)
    except Exception as exc:
        raise SerializationError(
            f"stored value does not fit its type {hint or tag} ({type(exc).__name__}: {exc})",
            workflow=workflow,
            instance_id=instance_id,
            key=key,
        ) from exc


@functools.lru_cache(maxsize=1024)
def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references, builtins without hints
        return {}


def hints_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of ``fn``, cached; {} where there are none."""
    try:
        return _hints(fn)
    except TypeError:  # unhashable callable: resolve without caching
        return _hints.__wrapped__(fn)


def return_hint(fn: Callable[..., Any]) -> Any:
    """The return annotation of ``fn``, or None when it has none (``-> None`` included)."""
    hint = hints_of(fn).get("return")
    return None if hint is type(None) else hint
