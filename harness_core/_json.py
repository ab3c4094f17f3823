"""Strict JSON: the only values documents, entry data, task inputs and checkpoints may hold.

Python happily stores NaN, sets, tuples, bytes and functions in a dict; JSON storage would either reject them
late or silently change them. `strict_copy` rejects them early, naming the path, and returns a detached copy.
"""

from __future__ import annotations

import math
from typing import Any

from harness_core.errors import StrictJsonError


def strict_copy(value: Any, where: str = "value") -> Any:
    """Return a deep copy of `value` after checking that it is strict JSON."""
    return _copy(value, where)


def check_json(value: Any, where: str = "value") -> None:
    _copy(value, where)


def _copy(value: Any, path: str) -> Any:
    # bool is an int subclass; both are fine. Checked in order of frequency.
    if value is None or isinstance(value, (str, bool, int)):
        if isinstance(value, int) and not isinstance(value, bool) and type(value) is not int:
            raise StrictJsonError(f"{path}: {type(value).__name__} is not JSON (use a plain int)")
        if isinstance(value, str) and type(value) is not str:
            return str(value)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StrictJsonError(f"{path}: {value!r} is not JSON (NaN and infinities are not allowed)")
        return value
    if type(value) is dict:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise StrictJsonError(f"{path}: key {key!r} is not a string")
            out[key] = _copy(item, f"{path}.{key}")
        return out
    if type(value) is list:
        return [_copy(item, f"{path}[{index}]") for index, item in enumerate(value)]
    kind = type(value).__name__
    hint = ""
    if isinstance(value, (set, frozenset, tuple)):
        hint = " (use a list)"
    elif callable(value):
        hint = " (functions cannot be stored)"
    raise StrictJsonError(f"{path}: {kind} is not JSON{hint}")
