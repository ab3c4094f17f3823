"""`durable-bots doctor`: check everything the bot needs before (or while) it runs, one line per check.

Checks: the config (and the tool modules it names), the storage (opened read-only, SQLite or PostgreSQL:
works beside a running bot), Slack (`auth.test` with the bot token and the bot scopes it reports;
`apps.connections.open` with the app token in Socket Mode), Discord (`GET /gateway/bot` with the bot token; the
MESSAGE CONTENT intent in the application's flags), the model (a one-token request), the deploy webhook (a GET:
does anything answer? It never POSTs, so nothing is deployed). A failed check says how to fix it; the exit code
is 1 if any failed. Tokens are never printed; URLs are shown without credentials, path or query.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

import httpx

from adapters.redact import redact_url
from bots.config import BotConfig, ConfigError
from bots.runtime import EXIT_ERROR, EXIT_OK, BotError, build_models, check_tools, open_storage
from harness_core.messages import UserMessage
from harness_core.models import ModelRequest
from harness_core.storage import SqliteStorage

SLACK_API_URL = "https://slack.com/api/"
DISCORD_API_URL = "https://discord.com/api/v10"
SLACK_BOT_SCOPES = (
    "channels:history",
    "groups:history",
    "im:history",
    "mpim:history",
    "chat:write",
    "users:read",
    "usergroups:read",
    "app_mentions:read",
)
MESSAGE_CONTENT_FLAGS = (1 << 18) | (1 << 19)  # GATEWAY_MESSAGE_CONTENT, GATEWAY_MESSAGE_CONTENT_LIMITED
TIMEOUT = 15.0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}"
        return text if self.ok or not self.fix else f"{text}\n     fix: {self.fix}"


def origin(url: str) -> str:
    """scheme://host[:port] of a URL: no credentials, path or query (they may hold secrets)."""
    # Credentials masked by text first: urlsplit misreads a password holding '#' or '?' and refuses a bad
    # port, which crashed the doctor with part of the password in the error.
    parts = urlsplit(redact_url(url))
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host or '?'}"


async def doctor_command(
    config: BotConfig,
    env: Mapping[str, str],
    out: TextIO,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> int:
    checks: list[Check] = []
    problems = check_tools(config)
    if problems:
        for problem in problems:
            checks.append(Check("config", False, str(problem), "edit the file at that line"))
    else:
        checks.append(Check("config", True, f"{config.source} is valid"))
    checks.extend(await _guarded("storage", check_storage(config, env)))
    async with httpx.AsyncClient(timeout=TIMEOUT, transport=transport) as http:
        if "slack" in config.adapters and config.adapter_enabled("slack"):
            checks.extend(await _guarded("slack", check_slack(config, env, http)))
        if "discord" in config.adapters and config.adapter_enabled("discord"):
            checks.extend(await _guarded("discord", check_discord(config, env, http)))
        checks.extend(await _guarded(f"model {config.bot.model}", check_model(config, env)))
        webhook = env.get("DEPLOY_WEBHOOK_URL") or config.deploy.webhook_url
        if webhook:
            checks.extend(await _guarded("deploy webhook", check_webhook(webhook, http)))
    for check in checks:
        print(check.line(), file=out)
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} ok, {len(failed)} failed", file=out)
    return EXIT_ERROR if failed else EXIT_OK


async def _guarded(name: str, check: Awaitable[Check | list[Check]]) -> list[Check]:
    """A check that broke unexpectedly is a failed check, not a traceback."""
    try:
        found = await check
    except Exception as exc:
        return [
            Check(name, False, f"the check itself failed: {type(exc).__name__}", "run with --log-level DEBUG")
        ]
    return found if isinstance(found, list) else [found]


async def check_storage(config: BotConfig, env: Mapping[str, str]) -> Check:
    try:
        target = config.storage_target(env)
    except ConfigError as exc:
        return Check("storage", False, str(exc), "fix DATABASE_URL (or name the storage in the config)")
    if target.kind == "postgres":
        return await _check_postgres(config, env)
    path = target.path or config.storage_path
    if not path.exists():
        return Check("storage", True, f"{path} does not exist yet; the bot creates it at its first start")
    try:
        storage = await SqliteStorage.open_read_only(path)
    except Exception as exc:
        return Check(
            "storage", False, f"{path}: {exc}", "restore it from a backup, or move it away to start empty"
        )
    try:
        page = await storage.scan_conversations(limit=1)
        detail = f"{path} opens read-only ({'has' if page.items else 'no'} conversations)"
    finally:
        await storage.close()
    return Check("storage", True, detail)


async def _check_postgres(config: BotConfig, env: Mapping[str, str]) -> Check:
    """Read-only, like the operator commands: no lease, so it works beside a running leader."""
    try:
        storage = await open_storage(config, env, read_only=True)
    except BotError as exc:  # its message names the store without the password
        return Check(
            "storage",
            False,
            str(exc),
            "check the server, the credentials and that the bot ran once against it",
        )
    try:
        page = await storage.scan_conversations(limit=1)
        detail = f"{storage.description} opens read-only ({'has' if page.items else 'no'} conversations)"
    finally:
        await storage.close()
    return Check("storage", True, detail)


async def _call(what: str, request: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response | str:
    try:
        return await request()
    except httpx.HTTPError as exc:
        return f"cannot reach {what} ({type(exc).__name__})"


async def check_slack(config: BotConfig, env: Mapping[str, str], http: httpx.AsyncClient) -> list[Check]:
    base = (env.get("SLACK_API_URL") or "").strip() or SLACK_API_URL
    base = base if base.endswith("/") else base + "/"
    checks: list[Check] = []
    token = env.get("SLACK_BOT_TOKEN")
    if not token:
        return [
            Check("slack auth.test", False, "SLACK_BOT_TOKEN is not set", "export SLACK_BOT_TOKEN=xoxb-…")
        ]
    got = await _call(
        "Slack",
        lambda: http.post(base + "auth.test", headers={"Authorization": f"Bearer {token}"}),
    )
    if isinstance(got, str):
        checks.append(Check("slack auth.test", False, got, f"check the network path to {origin(base)}"))
    else:
        body = _json(got)
        if body.get("ok"):
            team = body.get("team") or body.get("team_id") or "?"
            checks.append(Check("slack auth.test", True, f"bot token works (workspace {team})"))
            granted = got.headers.get("x-oauth-scopes")
            if granted is not None:
                missing = [s for s in SLACK_BOT_SCOPES if s not in {g.strip() for g in granted.split(",")}]
                checks.append(
                    Check(
                        "slack scopes",
                        not missing,
                        "all bot scopes granted" if not missing else f"missing {', '.join(missing)}",
                        "OAuth & Permissions → Bot Token Scopes: add them, then reinstall the app",
                    )
                )
        else:
            error = str(body.get("error", f"HTTP {got.status_code}"))
            checks.append(
                Check(
                    "slack auth.test",
                    False,
                    f"Slack refused the bot token ({error})",
                    "set SLACK_BOT_TOKEN to the Bot User OAuth Token (xoxb-…) of OAuth & Permissions; "
                    "reinstall the app if it was revoked",
                )
            )
    if str(config.adapter_options("slack").get("mode", "socket")) == "socket":
        checks.append(await _slack_socket(base, env.get("SLACK_APP_TOKEN"), http))
    elif not env.get("SLACK_SIGNING_SECRET"):
        checks.append(
            Check(
                "slack signing secret",
                False,
                "SLACK_SIGNING_SECRET is not set (HTTP mode verifies every request with it)",
                "Basic Information → Signing Secret: export SLACK_SIGNING_SECRET=…",
            )
        )
    return checks


async def _slack_socket(base: str, token: str | None, http: httpx.AsyncClient) -> Check:
    name = "slack apps.connections.open"
    fix = "create an app-level token with connections:write (Basic Information) and set SLACK_APP_TOKEN"
    if not token:
        return Check(name, False, "SLACK_APP_TOKEN is not set (Socket Mode needs it)", fix)
    got = await _call(
        "Slack",
        lambda: http.post(base + "apps.connections.open", headers={"Authorization": f"Bearer {token}"}),
    )
    if isinstance(got, str):
        return Check(name, False, got, f"check the network path to {origin(base)}")
    body = _json(got)
    if body.get("ok"):
        return Check(name, True, "Socket Mode is on and the app token works")
    return Check(
        name, False, f"Slack refused ({body.get('error', got.status_code)})", fix + "; turn Socket Mode on"
    )


async def check_discord(config: BotConfig, env: Mapping[str, str], http: httpx.AsyncClient) -> list[Check]:
    base = ((env.get("DISCORD_API_URL") or "").strip() or DISCORD_API_URL).rstrip("/")
    token = env.get("DISCORD_BOT_TOKEN")
    fix = "Developer Portal → Bot → Reset Token, and set DISCORD_BOT_TOKEN to it"
    if not token:
        return [Check("discord gateway/bot", False, "DISCORD_BOT_TOKEN is not set", fix)]
    headers = {"Authorization": f"Bot {token}"}
    got = await _call("Discord", lambda: http.get(base + "/gateway/bot", headers=headers))
    if isinstance(got, str):
        return [Check("discord gateway/bot", False, got, f"check the network path to {origin(base)}")]
    if got.status_code != 200:
        return [
            Check(
                "discord gateway/bot", False, f"Discord refused the bot token (HTTP {got.status_code})", fix
            )
        ]
    checks = [Check("discord gateway/bot", True, "bot token works")]
    if config.adapter_options("discord").get("message_content", True):
        app = await _call("Discord", lambda: http.get(base + "/oauth2/applications/@me", headers=headers))
        if not isinstance(app, str) and app.status_code == 200:
            flags = int(_json(app).get("flags") or 0)
            checks.append(
                Check(
                    "discord intents",
                    bool(flags & MESSAGE_CONTENT_FLAGS),
                    "MESSAGE CONTENT intent enabled"
                    if flags & MESSAGE_CONTENT_FLAGS
                    else "MESSAGE CONTENT intent is off: the bot sees only mentions, replies and DMs",
                    "Developer Portal → Bot → Privileged Gateway Intents: MESSAGE CONTENT on "
                    "(or set message_content = false in [adapters.discord])",
                )
            )
    return checks


async def check_model(config: BotConfig, env: Mapping[str, str]) -> Check:
    ref = config.bot.model_ref
    name = f"model {config.bot.model}"
    if ref.provider == "faux":
        return Check(name, True, "the offline demo model: nothing to call")
    key = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}.get(ref.provider, "")
    base = env.get(f"{ref.provider.upper()}_BASE_URL")
    where = origin(base) if base else "the provider's API"
    fix = f"check {key} and {ref.provider.upper()}_BASE_URL (now {where}) and the model name in [bot] model"
    models = build_models(ref, env)
    try:
        request = ModelRequest(messages=[UserMessage(content="Reply with OK.")], max_tokens=1)
        last = None

        async def ask() -> None:
            nonlocal last
            async for message in models.stream(ref, request):
                last = message

        await asyncio.wait_for(ask(), TIMEOUT)
    except TimeoutError:
        return Check(name, False, f"no answer from {where} within {TIMEOUT:g} s", fix)
    except Exception as exc:
        return Check(name, False, f"the request failed: {type(exc).__name__}: {exc}", fix)
    finally:
        await models.aclose()
    if last is None:
        return Check(name, False, f"{where} answered nothing", fix)
    if last.error is not None or last.stop_reason == "error":
        message = last.error.message if last.error else "error"
        return Check(name, False, f"{where} refused the request: {message}", fix)
    return Check(name, True, f"{where} answered a one-token request")


async def check_webhook(url: str, http: httpx.AsyncClient) -> Check:
    where = origin(url)
    got = await _call("the webhook", lambda: http.get(url))
    if isinstance(got, str):
        return Check(
            "deploy webhook",
            False,
            f"{where}: {got}",
            "check deploy.webhook_url / DEPLOY_WEBHOOK_URL",
        )
    return Check(
        "deploy webhook", True, f"{where} answers (HTTP {got.status_code} to a GET; nothing was deployed)"
    )


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
