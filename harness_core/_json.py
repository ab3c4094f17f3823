"""Strict JSON: the only values documents, entry data, task inputs and checkpoints may hold (DESIGN.md §2.3).

Python happily stores NaN, sets, tuples, bytes and functions in a dict; JSON storage would either reject them
late or silently change them. `strict_copy` rejects them early, naming the path, and returns a detached copy.
The rules:

- values are dicts with string keys, lists, strings, ints, finite floats, booleans and None. Subclasses of
  str and float are copied as the plain value; enum members, sets, tuples, bytes, dates, Decimals, NaN and
  infinities are refused (nothing is converted, so what is read back equals what was written);
- strings and keys must be valid Unicode: an unpaired UTF-16 surrogate (`"\\ud83d"`, which JSON allows and
  UTF-8 cannot encode) is refused. Text from outside (platform messages, model output, tool output) is made
  valid at the boundary with `clean_text` / `clean_json`, which turn unpaired surrogates into U+FFFD;
- ints must fit in 64 bits (-2**63 .. 2**63-1), the range every JSON store and peer keeps exactly; store
  larger numbers as strings;
- a value nests at most `MAX_DEPTH` (128) lists and objects. Records the harness builds around such values
  (checkpoints, memos, core documents, messages) are checked against `WRAPPED_DEPTH`, which leaves room for the
  wrapping and still stays below what the JSON readers of the storage backends accept.

The walk runs on every commit (drafted documents, task records), so it is written for the common case: exact
types are checked with `type(x) is ...`, ASCII strings pass with an O(1) `isascii()`, leaves are copied inline
without a call, and the path of an offending value is assembled only when one is found (an internal exception
collects it on the way out) instead of formatting a path string for every node.
"""

from __future__ import annotations

import enum
import math
from typing import Any

from pydantic import BaseModel

from harness_core.errors import StrictJsonError

MAX_DEPTH = 128
"""Lists and objects a value given to the harness may nest (entry data, task input, documents, tool details)."""

WRAPPED_DEPTH = MAX_DEPTH + 32
"""The limit for records that wrap such values (checkpoints, memos, core documents, messages)."""

INT_MIN = -(2**63)
INT_MAX = 2**63 - 1


class _Bad(Exception):
    """An offending value somewhere below; `parts` collects the path segments, innermost first."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.parts: list[str] = []


# --- making outside text valid -------------------------------------------------------------------------------


def clean_text(text: str) -> str:
    """`text` with every unpaired UTF-16 surrogate replaced by U+FFFD.

    A surrogate pair that arrived as two code points (a `"\\ud83d\\ude00"` split across two JSON strings) is
    joined into its character instead. Valid text is returned as is (ASCII in O(1)). Use it on text that comes
    from outside (platform messages and names, model output, tool output) before handing it to the harness.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def clean_json(value: Any, where: str = "value", *, limit: int = MAX_DEPTH) -> Any:
    """A strict copy of `value` with every string and key made valid by `clean_text`.

    For structured data from outside (a platform payload, a tool's details). Everything else follows the strict
    rules: NaN, sets, non-string keys, ints beyond 64 bits and nesting past `limit` raise `StrictJsonError`.
    Keys that become equal after cleaning keep the last value.
    """
    try:
        return _clean(value, 0, limit)
    except _Bad as bad:
        raise _error(where, bad) from None


def _clean(value: Any, depth: int, limit: int) -> Any:
    kind = type(value)
    if kind is str:
        return clean_text(value)
    if kind is dict:
        if depth >= limit:
            raise _too_deep(limit)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Bad(f"key {key!r} is not a string")
            key = clean_text(key)
            try:
                out[key] = _clean(item, depth + 1, limit)
            except _Bad as bad:
                bad.parts.append(_key_part(key))
                raise
        return out
    if kind is list:
        if depth >= limit:
            raise _too_deep(limit)
        copied: list[Any] = []
        for index, item in enumerate(value):
            try:
                copied.append(_clean(item, depth + 1, limit))
            except _Bad as bad:
                bad.parts.append(f"[{index}]")
                raise
        return copied
    if isinstance(value, str) and not isinstance(value, enum.Enum):
        return clean_text(str.__str__(value))
    return _copy(value, depth, limit)


# --- checking ------------------------------------------------------------------------------------------------


def strict_copy(value: Any, where: str = "value", *, limit: int = MAX_DEPTH) -> Any:
    """Return a deep copy of `value` after checking that it is strict JSON (see the module docstring)."""
    try:
        return _copy(value, 0, limit)
    except _Bad as bad:
        raise _error(where, bad) from None


def check_json(value: Any, where: str = "value", *, limit: int = MAX_DEPTH) -> None:
    """Check that `value` is strict JSON without copying it."""
    try:
        _check(value, 0, limit)
    except _Bad as bad:
        raise _error(where, bad) from None


def check_text(text: str | None, where: str) -> None:
    """Check one string field of a record (None passes)."""
    if text is not None and not (type(text) is str and text.isascii()):
        check_json(text, where)


def check_record(value: Any, where: str, *, limit: int = WRAPPED_DEPTH) -> None:
    """Check a pydantic record (a message, an outcome) field by field: its free-form values must be strict
    JSON and its strings valid Unicode, so that serializing it can neither fail nor change anything."""
    try:
        _check_record(value, 0, limit)
    except _Bad as bad:
        raise _error(where, bad) from None


def _check_record(value: Any, depth: int, limit: int) -> None:
    if isinstance(value, BaseModel):
        if depth >= limit:
            raise _too_deep(limit)
        for name, item in value.__dict__.items():
            kind = type(item)
            if (
                (kind is str and item.isascii())
                or item is None
                or kind is bool
                or (kind is int and INT_MIN <= item <= INT_MAX)
            ):
                continue
            try:
                _check_record(item, depth + 1, limit)
            except _Bad as bad:
                bad.parts.append(f".{name}")
                raise
        return
    if type(value) is list:
        if depth >= limit:
            raise _too_deep(limit)
        for index, item in enumerate(value):
            try:
                _check_record(item, depth + 1, limit)
            except _Bad as bad:
                bad.parts.append(f"[{index}]")
                raise
        return
    _check(value, depth, limit)


def _error(where: str, bad: _Bad) -> StrictJsonError:
    # Cleaned: the message is stored and shown (a task's fault), so it must not carry the bad character itself.
    parts = bad.parts[::-1]
    if len(parts) > 12:  # a value nested too deep: the outer steps say where it is
        parts = [*parts[:8], f"…({len(parts) - 8} more)"]
    return StrictJsonError(clean_text(f"{where}{''.join(parts)}: {bad.message}"))


def _too_deep(limit: int) -> _Bad:
    return _Bad(f"nesting deeper than {limit} levels of lists and objects is not allowed")


def _key_part(key: str) -> str:
    return f".{key}"


def _bad_key(key: Any) -> _Bad:
    if type(key) is not str:
        return _Bad(f"key {key!r} is not a string")
    return _Bad(
        f"key {key!r} is not valid Unicode (an unpaired surrogate; clean outside text with clean_text)"
    )


def _copy(value: Any, depth: int, limit: int) -> Any:
    kind = type(value)
    if (kind is str and value.isascii()) or kind is bool or value is None:
        return value
    if kind is dict:
        if depth >= limit:
            raise _too_deep(limit)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or _valid(key)):
                raise _bad_key(key)
            leaf = type(item)
            if (leaf is str and item.isascii()) or item is None or leaf is bool:
                out[key] = item
                continue
            if leaf is int and INT_MIN <= item <= INT_MAX:
                out[key] = item
                continue
            try:
                out[key] = _copy(item, depth + 1, limit)
            except _Bad as bad:
                bad.parts.append(_key_part(key))
                raise
        return out
    if kind is list:
        if depth >= limit:
            raise _too_deep(limit)
        copied: list[Any] = []
        append = copied.append
        for index, item in enumerate(value):
            leaf = type(item)
            if (leaf is str and item.isascii()) or item is None or leaf is bool:
                append(item)
                continue
            if leaf is int and INT_MIN <= item <= INT_MAX:
                append(item)
                continue
            try:
                append(_copy(item, depth + 1, limit))
            except _Bad as bad:
                bad.parts.append(f"[{index}]")
                raise
        return copied
    return _other(value)


def _check(value: Any, depth: int, limit: int) -> None:
    kind = type(value)
    if (kind is str and value.isascii()) or kind is bool or value is None:
        return
    if kind is dict:
        if depth >= limit:
            raise _too_deep(limit)
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or _valid(key)):
                raise _bad_key(key)
            leaf = type(item)
            if (leaf is str and item.isascii()) or item is None or leaf is bool:
                continue
            if leaf is int and INT_MIN <= item <= INT_MAX:
                continue
            try:
                _check(item, depth + 1, limit)
            except _Bad as bad:
                bad.parts.append(_key_part(key))
                raise
        return
    if kind is list:
        if depth >= limit:
            raise _too_deep(limit)
        for index, item in enumerate(value):
            leaf = type(item)
            if (leaf is str and item.isascii()) or item is None or leaf is bool:
                continue
            if leaf is int and INT_MIN <= item <= INT_MAX:
                continue
            try:
                _check(item, depth + 1, limit)
            except _Bad as bad:
                bad.parts.append(f"[{index}]")
                raise
        return
    _other(value)


def _valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _other(value: Any) -> Any:
    """Non-ASCII strings, ints, floats, subclasses of the JSON types and everything that is not JSON."""
    kind = type(value)
    if kind is str:
        if _valid(value):
            return value
        raise _Bad(
            "string is not valid Unicode (it holds an unpaired surrogate; clean outside text with clean_text)"
        )
    if kind is int:
        if INT_MIN <= value <= INT_MAX:
            return value
        raise _Bad(f"int {_short_int(value)} is outside the 64-bit range JSON storage keeps (store a string)")
    if kind is float:
        if not math.isfinite(value):
            raise _Bad(f"{value!r} is not JSON (NaN and infinities are not allowed)")
        return value
    if isinstance(value, enum.Enum):
        return _refuse_enum(value)
    # bool is an int subclass and cannot be subclassed itself; exact bools never get here.
    if isinstance(value, int):
        raise _Bad(f"{kind.__name__} is not JSON (use a plain int)")
    if isinstance(value, str):
        return _other(str.__str__(value))  # its characters, as json.dumps writes them (str() may differ)
    if isinstance(value, float):
        return _other(float.__float__(value))
    hint = ""
    if isinstance(value, (set, frozenset, tuple)):
        hint = " (use a list)"
    elif isinstance(value, (bytes, bytearray, memoryview)):
        hint = " (store text, or base64 for binary data)"
    elif callable(value):
        hint = " (functions cannot be stored)"
    raise _Bad(f"{kind.__name__} is not JSON{hint}")


def _refuse_enum(value: enum.Enum) -> Any:
    if isinstance(value, int):
        raise _Bad(f"{type(value).__name__} is not JSON (use a plain int)")
    raise _Bad(f"{type(value).__name__} is not JSON (store its value: {value.value!r})")


def _short_int(value: int) -> str:
    digits = len(str(abs(value))) if value.bit_length() < 10_000 else None
    if digits is not None and digits <= 30:
        return str(value)
    return f"with {'more than 3000' if digits is None else digits} digits"
