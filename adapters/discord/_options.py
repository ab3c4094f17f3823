"""The adapter's configuration: the `[adapters.discord]` TOML table (validated here, errors name the key) plus
what only the environment may hold (the token, endpoint overrides)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator

from adapters.discord._endpoints import _normalise_api_url, _normalise_gateway_url

TOKEN_ENV = "DISCORD_BOT_TOKEN"
API_URL_ENV = "DISCORD_API_URL"
GATEWAY_URL_ENV = "DISCORD_GATEWAY_URL"


class DiscordConfigError(ValueError):
    """The `[adapters.discord]` table or the environment is invalid; the message names the key."""


class DiscordOptions(BaseModel):
    """Options of the `[adapters.discord]` table. Secrets never go here (the token comes from the environment)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    edit_interval: float = Field(1.0, gt=0, le=60)
    """Seconds between two writes into one channel (sends and edits of every answer there share it; Discord's
    per-channel bucket allows about one per second)."""
    max_ratelimit_timeout: float = Field(30.0, ge=30, le=3600)
    """A 429 asking to wait longer than this is not slept through by discord.py; the bridge retries the call
    later instead (discord.py does not accept less than 30 s)."""
    request_timeout: float = Field(60.0, gt=0, le=600)
    """Seconds one REST call may take, discord.py's own rate-limit waits included, before it counts as failed
    (the bridge then finds the post by its nonce or marker before posting again). Without it aiohttp waits
    five minutes, and every write into that channel waits behind the hung one. Keep it above
    `max_ratelimit_timeout`, or a long rate-limit wait is cut short and retried."""
    message_content: bool = True
    """Request the MESSAGE_CONTENT privileged intent and refuse to start when the application lacks it. False:
    run on mentions, replies to the bot and DMs only (the only messages whose text Discord then delivers)."""
    catch_up_limit: int = Field(1000, ge=0, le=100_000)
    """At most this many missed messages are read per channel or thread at startup."""
    catch_up_hours: float = Field(24.0, ge=0, le=720)
    """Look-back for guild channels and active threads the bot can read but has no conversation for yet (0: only
    known ones). Never reaches back before the bot first watched the guild."""
    edit_age_limit: float = Field(3300.0, gt=0, le=3600)
    """Seconds after which a message (aged by the time in its id) is no longer edited: a streaming answer
    continues in a new message, a decided approval is announced in a reply. Discord refuses edits of messages
    older than an hour after an undocumented number of them (30046); the margin below the hour covers a
    clock that differs from Discord's."""
    find_scan_limit: int = Field(100, ge=1, le=1000)
    """How many recent messages of a channel are scanned for a post whose id a crash kept from being recorded."""
    guild_ready_timeout: float = Field(2.0, ge=0, le=60)
    """discord.py's wait for GUILD_CREATE events after READY."""
    ready_timeout: float = Field(60.0, gt=0, le=600)
    """How long `start()` waits for the gateway session and the startup catch-up."""
    heartbeat_timeout: float = Field(60.0, ge=1, le=600)
    """Seconds without any frame from the gateway (a HEARTBEAT_ACK or an event) after which discord.py takes
    the connection for dead, even if the socket looks open, closes it and RESUMEs on a new one (60 is
    discord.py's default). It must exceed the heartbeat interval Discord sends in HELLO (41.25 s) plus 5 s:
    discord.py waits 5 s before a new IDENTIFY without reading the socket, so a shorter timeout kills every
    new session before it starts (the adapter warns when it sees that)."""
    shard_count: int | None = Field(None, ge=1, le=65_536)
    """How many shards the bot's guilds are split into (Discord sends a guild's events to shard
    `(guild_id >> 22) % shard_count`). Unset: the count Discord recommends (`GET /gateway/bot`). Every worker
    of one bot must use the same count."""
    shard_ids: list[int] | None = None
    """Which shards this process connects (each its own gateway session). Unset: all of them. `[]`: none (the
    process still delivers answers over REST; workers that share a database take shards at runtime with
    `DiscordAdapter.set_shards`)."""

    @field_validator("shard_ids")
    @classmethod
    def _shard_ids_fit(cls, value: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if value is None:
            return None
        if len(set(value)) != len(value):
            raise ValueError("a shard id is listed twice")
        count = info.data.get("shard_count")
        for shard in value:
            if shard < 0 or (count is not None and shard >= count):
                top = f"{count - 1} (shard_count {count})" if count is not None else "the shard count - 1"
                raise ValueError(f"shard {shard} is out of range: ids go from 0 to {top}")
        return sorted(value)


@dataclass(frozen=True)
class DiscordSettings:
    options: DiscordOptions
    token: SecretStr = field(repr=False)
    api_url: str | None = None
    gateway_url: str | None = None


def _describe(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        key = ".".join(["adapters.discord", *(str(part) for part in item["loc"])])
        message = "unknown option" if item["type"] == "extra_forbidden" else item["msg"]
        problems.append(f"{key}: {message}")
    return "; ".join(problems)


def load_settings(options: Mapping[str, Any], env: Mapping[str, str]) -> DiscordSettings:
    """Validate the TOML table and read the token and endpoint overrides from `env`."""
    try:
        parsed = DiscordOptions.model_validate(dict(options))
    except ValidationError as error:
        raise DiscordConfigError(_describe(error)) from None
    token = (env.get(TOKEN_ENV) or "").strip()
    if not token:
        raise DiscordConfigError(f"{TOKEN_ENV} is not set (the bot token is only read from the environment)")
    api_url = env.get(API_URL_ENV) or None
    gateway_url = env.get(GATEWAY_URL_ENV) or None
    try:
        if api_url is not None:
            _normalise_api_url(api_url)
        if gateway_url is not None:
            _normalise_gateway_url(gateway_url)
    except ValueError as error:
        raise DiscordConfigError(str(error)) from None
    return DiscordSettings(parsed, SecretStr(token), api_url, gateway_url)
