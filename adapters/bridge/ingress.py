"""Ingress: a platform event that reached a worker which does not own its place (or gate) is committed as an
ingress record for the owner, then acknowledged; the owner takes it in with the usual exactly-once intake.

`Ingress` is the store's side (PostgreSQL implements it; `testing.MemoryIngress` for tests). This module also
turns an `IncomingMessage` or a click into strict JSON and back. Reading a record back is as strict as reading a
platform payload: every string passes `valid_text` (a lone surrogate becomes U+FFFD, as at the platform
boundary), and anything of the wrong shape raises `IngressPayloadError` naming the field, so the consumer can
finish the record as refused and go on with the next.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, get_args

from adapters.bridge.approvals import Action, ClickOrigin
from adapters.bridge.model import IncomingMessage, Place
from adapters.bridge.outside import valid_text

MESSAGE = "message"
CLICK = "click"
VERSION = 1


class IngressRecordLike(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def partition(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def payload(self) -> dict[str, Any]: ...


class Ingress(Protocol):
    async def put_ingress(self, partition: int, kind: str, key: str, payload: dict[str, Any]) -> bool:
        """Commit durably; False when `key` is already there (from any worker). Wakes the partition's owner."""
        ...

    async def pending_ingress(
        self, partitions: Collection[int], limit: int = 100
    ) -> Sequence[IngressRecordLike]:
        """Records not finished yet, in id order."""
        ...

    async def finish_ingress(self, record_id: int) -> None: ...

    async def finish_ingresses(self, record_ids: Collection[int]) -> None:
        """Finish many records in one statement (finishing one twice is harmless)."""
        ...

    async def drop_ingresses(self, record_ids: Collection[int]) -> None:
        """Delete records, freeing their keys (a refused click, so its clicker may click again)."""
        ...

    def on_ingress(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call `callback(partition)` when a record for `partition` was put; returns the unsubscribe."""
        ...


class IngressPayloadError(ValueError):
    """An ingress record whose payload is not a message or click this version can read."""


@dataclass(frozen=True)
class Click:
    """A click on a gate's button (or a decision made elsewhere), as `Bridge.decide` takes it."""

    gate_id: int
    user_id: str
    user_name: str
    action: Action
    user_groups: tuple[str, ...] | None = None
    origin: ClickOrigin | None = None
    platform: str | None = None
    operator: bool = False

    @property
    def key(self) -> str:
        """One record per click identity: a double click (or a re-sent interaction) is one record. A click its
        gate's owner refuses is dropped, freeing the key for that person's next click."""
        return f"click:{self.platform or ''}:{self.gate_id}:{self.user_id}:{self.action}"


def message_payload(message: IncomingMessage) -> dict[str, Any]:
    return {
        "v": VERSION,
        "place": message.place.to_json(),
        "message_id": message.message_id,
        "user_id": message.user_id,
        "user_name": message.user_name,
        "text": message.text,
        "mentions_bot": message.mentions_bot,
        "is_dm": message.is_dm,
        "reply_to": message.reply_to,
    }


def message_from_payload(payload: Mapping[str, Any]) -> IncomingMessage:
    _check_version(payload)
    place = payload.get("place")
    if not isinstance(place, Mapping):
        raise IngressPayloadError("message payload: `place` must be an object")
    return IncomingMessage(
        Place(
            _text(place, "platform", "place."),
            _text(place, "workspace", "place."),
            _text(place, "channel", "place."),
            _optional_text(place, "thread", "place."),
        ),
        _text(payload, "message_id"),
        _text(payload, "user_id"),
        _text(payload, "user_name"),
        _text(payload, "text"),
        mentions_bot=_flag(payload, "mentions_bot"),
        is_dm=_flag(payload, "is_dm"),
        reply_to=_optional_text(payload, "reply_to"),
    )


def click_payload(click: Click) -> dict[str, Any]:
    return {
        "v": VERSION,
        "gate_id": click.gate_id,
        "user_id": click.user_id,
        "user_name": click.user_name,
        "action": click.action,
        "user_groups": None if click.user_groups is None else list(click.user_groups),
        "origin": None
        if click.origin is None
        else {"channel": click.origin.channel, "message_id": click.origin.message_id},
        "platform": click.platform,
        "operator": click.operator,
    }


def click_from_payload(payload: Mapping[str, Any]) -> Click:
    _check_version(payload)
    gate_id = payload.get("gate_id")
    if not isinstance(gate_id, int) or isinstance(gate_id, bool) or gate_id < 0:
        raise IngressPayloadError("click payload: `gate_id` must be a non-negative integer")
    action: Action
    match payload.get("action"):
        case "approve" | "deny" | "withdraw" as found:
            action = found
        case _:
            raise IngressPayloadError(f"click payload: `action` must be one of {', '.join(get_args(Action))}")
    groups = payload.get("user_groups")
    if groups is not None and not (isinstance(groups, list) and all(isinstance(g, str) for g in groups)):
        raise IngressPayloadError("click payload: `user_groups` must be a list of strings or null")
    origin = payload.get("origin")
    if origin is not None and not isinstance(origin, Mapping):
        raise IngressPayloadError("click payload: `origin` must be an object or null")
    return Click(
        gate_id,
        _text(payload, "user_id"),
        _text(payload, "user_name"),
        action,
        None if groups is None else tuple(valid_text(g) for g in groups),
        None
        if origin is None
        else ClickOrigin(_text(origin, "channel", "origin."), _text(origin, "message_id", "origin.")),
        _optional_text(payload, "platform"),
        _flag(payload, "operator"),
    )


def _check_version(payload: Mapping[str, Any]) -> None:
    if not isinstance(payload, Mapping):
        raise IngressPayloadError("payload must be an object")
    if payload.get("v") != VERSION:
        raise IngressPayloadError(
            f"payload version {payload.get('v')!r} is not {VERSION} (a newer worker wrote it?)"
        )


def _text(value: Mapping[str, Any], name: str, prefix: str = "") -> str:
    found = value.get(name)
    if not isinstance(found, str):
        raise IngressPayloadError(f"payload: `{prefix}{name}` must be a string")
    return valid_text(found)


def _optional_text(value: Mapping[str, Any], name: str, prefix: str = "") -> str | None:
    return None if value.get(name) is None else _text(value, name, prefix)


def _flag(value: Mapping[str, Any], name: str) -> bool:
    found = value.get(name, False)
    if not isinstance(found, bool):
        raise IngressPayloadError(f"payload: `{name}` must be true or false")
    return found
