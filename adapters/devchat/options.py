"""Options of the devchat adapter: the `[adapters.devchat]` table of a bot config, validated with pydantic."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

CHANNEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MIN_TOKEN_CHARS = 16


class DevchatConfigError(ValueError):
    """Invalid devchat options; the message names every offending key."""


class DevchatOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    """Address to bind. devchat has no login (anyone who reaches it can pick any name): keep it on loopback."""
    port: int = Field(8765, ge=0, le=65535)
    """TCP port; 0 picks a free one (the adapter's `url` tells which)."""
    store: Path = Path("var/devchat.sqlite")
    """The chat's own SQLite file (channels, messages, event log); created 0600."""
    workspace: str = Field("local", min_length=1, max_length=64)
    """The workspace part of every place (`devchat:<workspace>.<store id>:<channel>[:<thread>]`; the store id is
    minted with the store file, so posts in a new store never reuse the request ids of a deleted one)."""
    channels: list[str] = Field(default_factory=lambda: ["general", "ops"])
    """Channels that always exist; users can add more from the page."""
    bot_name: str = Field("bot", min_length=1, max_length=32)
    """Shown as the author of bot messages; `@<bot_name>` in a message mentions the bot."""
    approvers: list[str] | None = None
    """Display names allowed to click Approve/Deny on devchat. None: the bridge's approval policy alone decides
    (its approver ids are devchat display names). When set, a click must pass this list AND the policy."""
    edit_interval: float = Field(0.2, ge=0.0, le=10.0)
    """Seconds between two writes into one channel, shared by every answer there (devchat has no rate limit;
    this only keeps the page calm)."""
    max_chars: int = Field(4000, ge=200, le=100_000)
    """Longest message text; longer answers are split by the bridge."""
    keep_events: int = Field(10_000, ge=100)
    """Events kept in the log for reconnecting clients; a client further behind gets a snapshot."""
    allow_remote: bool = False
    """Required to bind a non-loopback host (devchat has no authentication); then DEVCHAT_TOKEN is required."""
    token: str | None = Field(None, repr=False, exclude=True)
    """The access token the page and its websocket must present (from DEVCHAT_TOKEN only, never the file).
    Required off loopback; optional on it."""
    all_platforms: bool = False
    """Show (and allow retrying) tasks and approval requests of every platform on the panel. Off: only those of
    devchat's own conversations (a devchat user is a typed name, not an account of Slack or Discord)."""

    @field_validator("channels")
    @classmethod
    def _channels(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one channel")
        for name in value:
            if not CHANNEL_NAME.match(name):
                raise ValueError(f"{name!r} is not a channel name (a-z, 0-9, '-', '_'; at most 32)")
        return list(dict.fromkeys(value))

    @field_validator("bot_name")
    @classmethod
    def _bot_name(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", value):
            raise ValueError("letters, digits, '_', '.', '-' only")
        return value

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        return [clean_name(name) for name in value]


def clean_name(raw: str) -> str:
    """A display name as devchat stores it: trimmed, 1-32 printable characters."""
    name = " ".join(raw.split())
    if not 1 <= len(name) <= 32 or not name.isprintable():
        raise ValueError("a display name has 1 to 32 printable characters")
    return name


def parse_options(options: Mapping[str, Any], env: Mapping[str, str]) -> DevchatOptions:
    """Validate `options` (the TOML table); `DEVCHAT_HOST` / `DEVCHAT_PORT` in `env` override host and port."""
    values = dict(options)
    if "token" in values:
        raise DevchatConfigError(
            "adapters.devchat.token: secrets do not belong in the config file: remove this key and set "
            "DEVCHAT_TOKEN in the environment instead"
        )
    values["token"] = env.get("DEVCHAT_TOKEN") or None
    if env.get("DEVCHAT_HOST"):
        values["host"] = env["DEVCHAT_HOST"]
    if env.get("DEVCHAT_PORT"):
        values["port"] = env["DEVCHAT_PORT"]
    try:
        parsed = DevchatOptions.model_validate(values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"]) or "(table)"
            problems.append(f"adapters.devchat.{key}: {error['msg']}")
        raise DevchatConfigError("; ".join(problems)) from None
    if parsed.host not in LOOPBACK and not parsed.allow_remote:
        raise DevchatConfigError(
            f"adapters.devchat.host: {parsed.host!r} is not a loopback address; devchat has no login, "
            "set allow_remote = true to bind it anyway"
        )
    if parsed.host not in LOOPBACK and not parsed.token:
        raise DevchatConfigError(
            f"adapters.devchat.allow_remote: devchat on {parsed.host!r} is reachable from other machines: set "
            f"DEVCHAT_TOKEN in the environment (at least {MIN_TOKEN_CHARS} characters); the page then asks for it"
        )
    if parsed.token is not None and len(parsed.token) < MIN_TOKEN_CHARS:
        raise DevchatConfigError(
            f"adapters.devchat: DEVCHAT_TOKEN is too short: use at least {MIN_TOKEN_CHARS} random characters"
        )
    return parsed


def remote_warning(options: DevchatOptions) -> str | None:
    """What the operator must know about a devchat reachable from other machines."""
    if options.host in LOOPBACK:
        return None
    return (
        f"devchat listens on {options.host} (not loopback): anyone with DEVCHAT_TOKEN can post and click as any "
        "name they type; devchat identities are unauthenticated names, not accounts"
    )
