"""Configuration of the Slack adapter: the `[adapters.slack]` table (validated, errors name the key) and the
secrets, which come only from the environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_API_URL = "https://slack.com/api/"


class SlackConfigError(ValueError):
    """The `[adapters.slack]` table or the Slack environment variables are invalid (the message names the key)."""


class SlackOptions(BaseModel):
    """The `[adapters.slack]` table of a bot config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """Read by the host that picks adapters; the adapter itself ignores it."""
    mode: Literal["socket", "http"] = "socket"
    """`socket`: Socket Mode (needs SLACK_APP_TOKEN); `http`: Events API endpoint (needs SLACK_SIGNING_SECRET)."""
    host: str = "127.0.0.1"
    """HTTP mode: address to listen on."""
    port: int = Field(default=3000, ge=0, le=65535)
    """HTTP mode: port to listen on (0: any free port; see `SlackAdapter.url`)."""
    path: str = Field(default="/slack/events", pattern=r"^/")
    """HTTP mode: the Request URL path for events and interactivity."""
    max_body: int = Field(default=512 * 1024, ge=16 * 1024, le=4 * 1024 * 1024)
    """HTTP mode: largest request body read, in bytes. A message event carries at most 40,000 characters of
    text (twice, with its rich-text blocks); a larger body is refused (413, `X-Slack-No-Retry: 1`) before it
    is read, and an unsigned one is refused (401) on its headers alone, so no request can make the bot buffer
    more than this."""
    max_chars: int = Field(default=3500, ge=100, le=12_000)
    """Longest message part. Slack truncates `text` past 40,000 characters, recommends under 4,000, and takes
    at most 12,000 characters of `markdown_text` per call: 3,500 leaves room for markdown expansion. Counted
    after escaping (`&` is sent as `&amp;`), so an answer full of `&<>` is split into more parts, never cut."""
    edit_interval: float = Field(default=1.0, ge=0.0, le=60.0)
    """Seconds between two writes into one channel (posts, stream appends and `chat.update`s of every answer
    there share it; Slack allows about one message per second per channel, `chat.update` is Tier 3)."""
    stream: bool = True
    """Stream partial answers inside threads with `chat.startStream`/`appendStream`/`stopStream`."""
    listen: bool = True
    """Take Slack events in this process (the Socket Mode connection or the HTTP endpoint). False: a worker
    whose events are taken in by its separate intake process (`[workers] intake = "separate"`) and which only
    delivers and catches up here. Set by the worker runtime, not usually by hand."""
    catch_up: bool = True
    """On start, read history of known channels/threads since the last message seen, and of every other
    conversation the bot is a member of (`users.conversations`) back to `catch_up_hours`."""
    catch_up_hours: float = Field(default=24.0, ge=0.0, le=720.0)
    """Look-back for conversations the bot has no conversation for yet (0: only known ones). Never reaches
    back before the bot first watched the workspace."""
    catch_up_limit: int = Field(default=1000, ge=0)
    """At most this many messages per place on catch-up."""
    reconcile_limit: int = Field(default=1000, ge=1)
    """How many recent messages of a channel `find` scans for a reply's metadata key."""
    user_cache_ttl: float = Field(default=3600.0, ge=0.0)
    """Seconds a display name from `users.info` is reused."""
    group_cache_ttl: float = Field(default=60.0, ge=0.0)
    """Seconds a user group's members (`usergroups.users.list`) are reused for approval checks."""
    lookup_timeout: float = Field(default=2.0, gt=0.0, le=30.0)
    """Seconds a lookup on the intake path (display names) may take before the user id stands in."""
    ping_interval: float = Field(default=5.0, ge=0.1, le=60.0)
    """Socket Mode: seconds between two pings on the connection. A connection on which a pong does not come
    back within half an interval (or whose last pong is four intervals old) is taken for dead, even if the
    socket looks open, and replaced (`apps.connections.open` again); Slack redelivers what it did not get
    acked."""


@dataclass(frozen=True)
class SlackSecrets:
    bot_token: str = field(repr=False)
    app_token: str | None = field(default=None, repr=False)
    signing_secret: str | None = field(default=None, repr=False)
    api_url: str = DEFAULT_API_URL


def parse_options(options: Mapping[str, Any]) -> SlackOptions:
    try:
        return SlackOptions.model_validate(dict(options))
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"]) or "(table)"
            problems.append(f"adapters.slack.{key}: {error['msg']}")
        raise SlackConfigError("invalid [adapters.slack] config: " + "; ".join(problems)) from None


def load_secrets(options: SlackOptions, env: Mapping[str, str]) -> SlackSecrets:
    """Secrets only from the environment. Every missing variable is named at once (never a value), so one run of
    `check-config` tells the whole fix."""
    wanted = [("SLACK_BOT_TOKEN", "the Slack adapter posts with the bot token")]
    if options.mode == "socket":
        wanted.append(("SLACK_APP_TOKEN", "adapters.slack.mode = 'socket'"))
    if options.mode == "http":
        wanted.append(("SLACK_SIGNING_SECRET", "adapters.slack.mode = 'http' verifies request signatures"))
    values = {name: (env.get(name) or "").strip() for name, _ in wanted}
    missing = [f"{name} is not set ({why})" for name, why in wanted if not values[name]]
    if missing:
        raise SlackConfigError("; ".join(missing))
    bot_token = values["SLACK_BOT_TOKEN"]
    app_token = values.get("SLACK_APP_TOKEN") or None
    signing_secret = values.get("SLACK_SIGNING_SECRET") or None
    api_url = (env.get("SLACK_API_URL") or "").strip() or DEFAULT_API_URL
    if not api_url.endswith("/"):
        api_url += "/"
    return SlackSecrets(bot_token, app_token, signing_secret, api_url)
