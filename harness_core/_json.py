"""Strict JSON: the only values documents, entry data, task inputs and checkpoints may hold.

Python happily stores NaN, sets, tuples, bytes and functions in a dict; JSON storage would either reject them
late or silently change them. `strict_copy` rejects them early, naming the path, and returns a detached copy.

The walk runs on every commit (drafted documents, task records), so it is written for the common case: exact
types are checked with `type(x) is ...`, leaves are copied inline without a call, and the path of an offending
value is assembled only when one is found (an internal exception collects it on the way out) instead of
formatting a path string for every node.
"""

from __future__ import annotations

import math
from typing import Any

from harness_core.errors import StrictJsonError


class _Bad(Exception):
    """An offending value somewhere below; `parts` collects the path segments, innermost first."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.parts: list[str] = []


def strict_copy(value: Any, where: str = "value") -> Any:
    """Return a deep copy of `value` after checking that it is strict JSON."""
    try:
        return _copy(value)
    except _Bad as bad:
        raise _error(where, bad) from None


def check_json(value: Any, where: str = "value") -> None:
    """Check that `value` is strict JSON without copying it."""
    try:
        _check(value)
    except _Bad as bad:
        raise _error(where, bad) from None


def _error(where: str, bad: _Bad) -> StrictJsonError:
    return StrictJsonError(f"{where}{''.join(reversed(bad.parts))}: {bad.message}")


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Bad(f"key {key!r} is not a string")
            leaf = type(item)
            if leaf is str or leaf is int or leaf is bool or item is None:
                out[key] = item
                continue
            try:
                out[key] = _copy(item)
            except _Bad as bad:
                bad.parts.append(f".{key}")
                raise
        return out
    if kind is list:
        copied: list[Any] = []
        append = copied.append
        for index, item in enumerate(value):
            leaf = type(item)
            if leaf is str or leaf is int or leaf is bool or item is None:
                append(item)
                continue
            try:
                append(_copy(item))
            except _Bad as bad:
                bad.parts.append(f"[{index}]")
                raise
        return copied
    return _other(value)


def _check(value: Any) -> None:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise _Bad(f"key {key!r} is not a string")
            leaf = type(item)
            if leaf is str or leaf is int or leaf is bool or item is None:
                continue
            try:
                _check(item)
            except _Bad as bad:
                bad.parts.append(f".{key}")
                raise
        return
    if kind is list:
        for index, item in enumerate(value):
            leaf = type(item)
            if leaf is str or leaf is int or leaf is bool or item is None:
                continue
            try:
                _check(item)
            except _Bad as bad:
                bad.parts.append(f"[{index}]")
                raise
        return
    _other(value)


def _other(value: Any) -> Any:
    """Floats, subclasses of the JSON types and everything that is not JSON (rare: the slow path)."""
    # bool is an int subclass and cannot be subclassed itself; exact bools never get here.
    if isinstance(value, int) and not isinstance(value, bool):
        raise _Bad(f"{type(value).__name__} is not JSON (use a plain int)")
    if isinstance(value, str):
        return str.__str__(value)  # its characters, as json.dumps writes them (str() may differ: enums)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Bad(f"{value!r} is not JSON (NaN and infinities are not allowed)")
        return value
    kind = type(value).__name__
    hint = ""
    if isinstance(value, (set, frozenset, tuple)):
        hint = " (use a list)"
    elif callable(value):
        hint = " (functions cannot be stored)"
    raise _Bad(f"{kind} is not JSON{hint}")
