"""Tool-call argument JSON: best-effort parsing of a streaming prefix, and the final parse.

Convention shared by the providers for a finished tool call: when the model's argument text parses to a JSON
object, `ToolCall.arguments` holds it and `partial_json` is None. When it does not (invalid JSON, or JSON that is
not an object), `arguments` is `{}` and `partial_json` keeps the raw text on the final message. A complete call
that still has `partial_json` therefore means "the model sent invalid arguments", and the tool layer can report
that to the model with the raw text instead of running the tool.

Model output is text from outside (DESIGN.md §2.3): the arguments are parsed strictly and made valid. An unpaired
surrogate (`"\\ud83d"` in the JSON, or the character itself) becomes U+FFFD in the parsed strings and keys and
in the raw text; what strict JSON refuses (`NaN`/`Infinity`, numbers that overflow to infinity, ints beyond 64
bits, nesting past 128 levels) makes the arguments invalid, so the model is told instead of the harness
storing a changed value.
"""

from __future__ import annotations

import json
from typing import Any

from harness_core._json import MAX_DEPTH, clean_json, clean_text
from harness_core.errors import StrictJsonError
from harness_core.messages import ToolCall

_CLOSERS = {"{": "}", "[": "]"}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _strict_object(text: str) -> dict[str, Any]:
    """The JSON object in `text`, strict and made valid; ValueError (StrictJsonError is one) says why not."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(
            f"nesting deeper than {MAX_DEPTH} levels of lists and objects is not allowed"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but {type(value).__name__}")
    cleaned: dict[str, Any] = clean_json(value, "arguments", limit=MAX_DEPTH)
    return cleaned


def _loads_object(text: str) -> dict[str, Any] | None:
    try:
        return _strict_object(text)
    except ValueError:
        return None


def argument_problem(raw: str) -> str:
    """Why a finished call's argument text was not taken (for the error result the model gets)."""
    try:
        _strict_object(raw)
    except StrictJsonError as exc:
        return str(exc)
    except json.JSONDecodeError:
        return "not valid JSON"
    except ValueError as exc:
        return str(exc)
    return "not a JSON object"


def parse_partial_json(text: str) -> dict[str, Any]:
    """The object a JSON prefix is heading for, as far as it can be known; `{}` when nothing is usable.

    Strings cut mid-way are closed, open containers are closed, and a trailing incomplete member (a key
    without value, a cut literal or number) is dropped by backing off to the last comma or opening bracket.
    """
    text = text.strip()
    if not text:
        return {}
    complete = _loads_object(text)
    if complete is not None:
        return complete
    stack: list[str] = []
    cuts: list[tuple[int, str]] = []  # (prefix end, closers for that prefix)
    in_string = False
    escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in _CLOSERS:
            stack.append(_CLOSERS[char])
            cuts.append((index + 1, "".join(reversed(stack))))
        elif char in "}]":
            if stack:
                stack.pop()
            cuts.append((index + 1, "".join(reversed(stack))))
        elif char == ",":
            cuts.append((index, "".join(reversed(stack))))
    tail = text
    if in_string:
        if escaped:
            tail = tail[:-1]
        tail += '"'
    candidate = _loads_object(tail + "".join(reversed(stack)))
    if candidate is not None:
        return candidate
    for end, closers in reversed(cuts):
        candidate = _loads_object(text[:end] + closers)
        if candidate is not None:
            return candidate
    return {}


class ArgumentText:
    """The argument text of one streaming tool call and its latest partial parse.

    Re-parsing the whole prefix on every fragment would be quadratic for large arguments (a file written by a
    tool call can arrive in thousands of fragments), so small texts are parsed on every fragment and larger
    ones only after growing by a quarter: the partial view lags a little, the total cost stays linear.
    """

    SMALL = 2048

    def __init__(self, initial: str = "") -> None:
        self.raw = initial
        self.partial: dict[str, Any] = {}
        self._parsed_length = -1
        self._dirty = clean_text(initial) is not initial  # holds an unpaired surrogate (or half a pair)

    def append(self, fragment: str) -> None:
        self.raw += fragment
        if not self._dirty and clean_text(fragment) is not fragment:
            self._dirty = (
                True  # only then is the whole text cleaned, and a pair split across fragments joined
            )

    def apply(self, call: ToolCall) -> None:
        """Show the streaming state on `call`: raw text in `partial_json`, best-effort `arguments`."""
        call.partial_json = clean_text(self.raw) if self._dirty else self.raw
        size = len(self.raw)
        grown = size - self._parsed_length
        if size <= self.SMALL or grown >= max(self.SMALL, self._parsed_length // 4):
            self.partial = parse_partial_json(self.raw)
            self._parsed_length = size
        call.arguments = self.partial


def finish_tool_call(call: ToolCall, raw: str) -> None:
    """Set the final arguments of a completed call from its full argument text (see the module docstring)."""
    if not raw.strip():
        call.arguments = {}
        call.partial_json = None
        return
    parsed = _loads_object(raw)
    if parsed is None:
        call.arguments = {}
        call.partial_json = clean_text(raw)
    else:
        call.arguments = parsed
        call.partial_json = None
