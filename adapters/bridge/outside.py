"""Text from outside (platform payloads, user and channel names, page frames) made valid at the boundary.

JSON can carry an unpaired UTF-16 surrogate (`"\\ud83d"`); Python decodes it into a `str` that cannot be encoded
as UTF-8, so it would fail later, deep in storage, where one bad character must not stop intake. Every adapter
passes outside strings through `valid_text` (or a whole decoded payload through `valid_payload`) before they
reach the bridge: a surrogate pair split into two code points is joined, a lone surrogate becomes U+FFFD, and
the message is still taken in and answered, once.
"""

from __future__ import annotations

import re
from typing import Any

from harness_core import clean_text

REPLACEMENT = "\ufffd"
MAX_DEPTH = 64
"""Nesting accepted in a platform payload. Slack's and Discord's deepest (rich-text blocks, components) stay
well below; anything deeper is refused as malformed instead of walked."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]", re.ASCII)


class PayloadTooDeep(ValueError):
    """A payload nested deeper than `MAX_DEPTH`."""


# The harness's own boundary cleaner: `text` with every unpaired surrogate replaced by U+FFFD and a split pair
# joined (the same object when there is nothing to fix). One rule for adapters and harness alike.
valid_text = clean_text


def may_hold_surrogates(raw: str | bytes) -> bool:
    """Whether raw JSON text could decode to a string with a surrogate: an escaped one, or one already in a
    `str` (bytes cannot hold one, UTF-8 has no surrogates)."""
    if isinstance(raw, bytes):
        return _ESCAPED_SURROGATE.search(raw.decode("latin-1")) is not None
    return _ESCAPED_SURROGATE.search(raw) is not None or _SURROGATE.search(raw) is not None


def valid_payload(value: Any, *, max_depth: int = MAX_DEPTH) -> Any:
    """A decoded JSON value with `valid_text` applied to every string (keys too). Raises `PayloadTooDeep` past
    `max_depth` levels, so a hostile payload cannot exhaust the stack here or further on.

    Not `harness_core.clean_json`: that one is strict (NaN, ints beyond 64 bits, non-JSON values raise), and a
    platform payload must never be refused for a field the adapter does not even read. Only its strings are
    cleaned here; everything else is left as decoded."""
    return _walk(value, 0, max_depth)


def _walk(value: Any, depth: int, max_depth: int) -> Any:
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        if depth >= max_depth:
            raise PayloadTooDeep(f"payload nested deeper than {max_depth} levels")
        return {
            (valid_text(k) if isinstance(k, str) else k): _walk(v, depth + 1, max_depth)
            for k, v in value.items()
        }
    if isinstance(value, list):
        if depth >= max_depth:
            raise PayloadTooDeep(f"payload nested deeper than {max_depth} levels")
        return [_walk(v, depth + 1, max_depth) for v in value]
    return value
