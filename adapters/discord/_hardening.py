"""What keeps one hostile Discord payload from stopping the bot.

- **Lone surrogates.** A message may carry an unpaired UTF-16 surrogate as the JSON escape `"\\ud83d"`.
  discord.py decodes gateway frames and REST bodies with orjson when it is installed, and orjson refuses such a
  frame outright: the error ends `Client.connect` (only network errors reconnect), so the gateway task dies and
  the bot hears nothing more. `install_tolerant_json()` wraps discord.py's decoder: a body the fast decoder
  refuses, or one with escaped surrogates, is decoded with the standard library and made valid (U+FFFD).
  Process-wide, like `override_endpoints`, and idempotent.
- **Dispatches of a shape discord.py cannot parse.** A parser that raises (a missing key, a wrong type) would
  also end the connection. `guard_parsers(client)` makes each parser log the dispatch it could not read and drop
  it; the next event is handled as usual, and a dropped message is found again by the next catch-up.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import discord
import discord.utils

from adapters.bridge import PayloadTooDeep, may_hold_surrogates, valid_payload

log = logging.getLogger("adapters.discord")

MAX_DEPTH = 500  # only a decodable body is walked; discord.py's own payloads are a handful of levels deep


def _tolerant(decode: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def from_json(raw: Any) -> Any:
        try:
            value = decode(raw)
        except ValueError:
            if not isinstance(raw, (str, bytes)) or not may_hold_surrogates(raw):
                raise
            value = json.loads(raw)  # the standard library keeps a lone surrogate; it is replaced below
        else:
            if not isinstance(raw, (str, bytes)) or not may_hold_surrogates(raw):
                return value
        try:
            return valid_payload(value, max_depth=MAX_DEPTH)
        except PayloadTooDeep as exc:
            raise ValueError(str(exc)) from None

    from_json.tolerant = True  # type: ignore[attr-defined]
    return from_json


def install_tolerant_json() -> None:
    current = discord.utils._from_json
    if not getattr(current, "tolerant", False):
        discord.utils._from_json = _tolerant(current)


def _guarded(event: str, parse: Callable[[Any], None]) -> Callable[[Any], None]:
    def guarded(data: Any) -> None:
        try:
            parse(data)
        except Exception as exc:
            log.warning(
                "discord: dropped a %s dispatch discord.py could not read (%s: %s)",
                event,
                type(exc).__name__,
                exc,
            )

    return guarded


def guard_parsers(client: discord.Client) -> None:
    parsers = client._connection.parsers
    for event, parse in list(parsers.items()):
        parsers[event] = _guarded(event, parse)
