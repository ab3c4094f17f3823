"""The fake REST API: routing, auth, recording, request hooks, fault injection and the route handlers.

Every request is recorded before anything else happens. Then: bot-token check (interaction callback and
webhook routes are authenticated by the token in their URL, like Discord), ``before`` hooks (a hook that
returns a :class:`FakeResponse` answers instead of the fake, with no effect), the route's effect (synchronous,
so it is atomic), then ``after_effect`` hooks (which may replace the response, e.g. a 500 after the message was
stored, or SIGKILL a process before it can read the response).

Paths are matched without the ``/api/v{n}`` prefix, with templates written like discord.py's ``Route`` paths:
``/channels/{channel_id}/messages``.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from adapters.discord._fake_models import (
    DiscordAPIError,
    FakeGuild,
    FakeMessage,
    InteractionRecord,
    JsonDict,
    invalid_form,
    not_found,
    unauthorized,
    unknown_guild,
    unknown_member,
    unknown_user,
)
from adapters.discord._fake_state import World, as_int

HookWhen = Literal["before", "after_effect"]
RequestOutcome = Literal["pending", "ok", "error", "injected", "unauthorized", "unhandled"]
_SENDABLE_FLAGS = (1 << 2) | (1 << 12)  # SUPPRESS_EMBEDS | SUPPRESS_NOTIFICATIONS


@dataclass
class FakeResponse:
    """An HTTP response the fake sends: a JSON ``body`` (None for an empty body) with ``headers``."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def error(cls, status: int, code: int, message: str, errors: JsonDict | None = None) -> FakeResponse:
        """A Discord-shaped error: ``{"code": code, "message": message[, "errors": errors]}``."""
        return cls.from_api_error(DiscordAPIError(status, code, message, errors))

    @classmethod
    def from_api_error(cls, error: DiscordAPIError) -> FakeResponse:
        return cls(status=error.status, body=error.body())

    @classmethod
    def rate_limited(
        cls, retry_after: float, *, is_global: bool = False, scope: str = "user", bucket: str = "fake-bucket"
    ) -> FakeResponse:
        """A 429 exactly as discord.py needs it: ``retry_after`` in the JSON body, ``Retry-After``, the
        ``X-RateLimit-*`` headers, and a ``Via`` header (without ``Via`` discord.py assumes a Cloudflare ban and
        raises instead of retrying)."""
        headers = {
            "Retry-After": str(max(1, math.ceil(retry_after))),
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset-After": f"{retry_after:.3f}",
            "X-RateLimit-Bucket": bucket,
            "X-RateLimit-Scope": "global" if is_global else scope,
            "Via": "1.1 google",
        }
        if is_global:
            headers["X-RateLimit-Global"] = "true"
        body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": is_global}
        if is_global:
            body["code"] = 0
        return cls(status=429, body=body, headers=headers)


@dataclass(eq=False)
class RequestRecord:
    """One REST request as the fake saw it, and what it answered.

    ``path`` has no ``/api/v10`` prefix; ``route`` is the matched template (None for routes the fake does not
    implement); ``effect`` is True when the fake changed state (stored, edited, deleted, responded);
    ``deduplicated`` is True when ``enforce_nonce`` returned an earlier message instead of creating one.
    """

    seq: int
    method: str
    path: str
    route: str | None
    params: dict[str, str]
    query: dict[str, str]
    body: Any
    headers: dict[str, str]
    at: float
    files: list[JsonDict] = field(default_factory=list)
    status: int | None = None
    response: Any = None
    outcome: RequestOutcome = "pending"
    effect: bool = False
    deduplicated: bool = False
    killed_pid: int | None = None

    @property
    def json(self) -> JsonDict:
        """The request body as a dict (``{}`` when there was none)."""
        return self.body if isinstance(self.body, dict) else {}


HookResult = FakeResponse | None
RequestHookFn = Callable[[RequestRecord], Awaitable[HookResult] | HookResult]


def _compile_template(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{[^/{}]+\}", template)
    return re.compile("^" + "[^/]+".join(re.escape(p) for p in parts) + "$")


@dataclass(eq=False)
class RequestHook:
    """A registered hook. ``times=None`` fires forever; ``calls`` counts firings; :meth:`remove` unregisters."""

    method: str
    route: str
    fn: RequestHookFn = field(repr=False)
    when: HookWhen
    times: int | None
    match: Callable[[RequestRecord], bool] | None = field(default=None, repr=False)
    calls: int = 0
    _owner: list[RequestHook] | None = field(default=None, repr=False)
    _pattern: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.method = self.method.upper()
        self._pattern = _compile_template(self.route)

    @property
    def active(self) -> bool:
        return self.times is None or self.calls < self.times

    def matches(self, record: RequestRecord) -> bool:
        if not self.active:
            return False
        if self.method not in ("*", record.method):
            return False
        if self.route != record.route and not self._pattern.match(record.path):
            return False
        return self.match is None or self.match(record)

    async def fire(self, record: RequestRecord) -> HookResult:
        self.calls += 1
        result = self.fn(record)
        if inspect.isawaitable(result):
            return await result
        return result

    def remove(self) -> None:
        if self._owner is not None and self in self._owner:
            self._owner.remove(self)


@dataclass
class _Call:
    world: World
    record: RequestRecord
    params: dict[str, str]
    query: dict[str, str]
    body: JsonDict
    attachments: list[JsonDict]
    api: RestApi

    def param_id(self, name: str) -> int:
        try:
            return int(self.params[name])
        except ValueError:
            raise invalid_form(name, "NUMBER_TYPE_COERCE", "Value is not snowflake.") from None

    def ok(self, body: Any, status: int = 200) -> FakeResponse:
        return FakeResponse(status=status, body=body)


RouteHandler = Callable[[_Call], FakeResponse]


@dataclass(frozen=True)
class _Route:
    method: str
    template: str
    handler: RouteHandler
    auth: bool
    pattern: re.Pattern[str]


class RestApi:
    """REST side of the fake. ``records`` holds every request in arrival order."""

    def __init__(self, world: World, *, notify: Callable[[], None]) -> None:
        self.world = world
        self.records: list[RequestRecord] = []
        self.unhandled: list[RequestRecord] = []
        self.hooks: list[RequestHook] = []
        self.gateway_url = ""
        self.recommended_shards = 1  # what GET /gateway/bot answers in `shards`
        self._notify = notify
        self._routes: list[_Route] = []
        self._register_routes()

    # --- hooks ----------------------------------------------------------------------------------------------

    def add_hook(self, hook: RequestHook) -> RequestHook:
        hook._owner = self.hooks
        self.hooks.append(hook)
        return hook

    async def _run_hooks(self, record: RequestRecord, when: HookWhen) -> HookResult:
        result: HookResult = None
        for hook in list(self.hooks):
            if hook.when == when and hook.matches(record):
                hook_result = await hook.fire(record)
                if hook_result is not None and result is None:
                    result = hook_result
                    if when == "before":
                        break
        return result

    # --- routing --------------------------------------------------------------------------------------------

    def route(
        self, method: str, template: str, *, auth: bool = True
    ) -> Callable[[RouteHandler], RouteHandler]:
        def register(handler: RouteHandler) -> RouteHandler:
            self._routes.append(_Route(method, template, handler, auth, _compile_template(template)))
            return handler

        return register

    def _match(self, method: str, path: str) -> tuple[_Route | None, dict[str, str], bool]:
        path_matched = False
        for route in self._routes:
            m = route.pattern.match(path)
            if m is None:
                continue
            path_matched = True
            if route.method != method:
                continue
            names = re.findall(r"\{([^/{}]+)\}", route.template)
            values = [
                seg for seg, tpl in zip(path.split("/"), route.template.split("/"), strict=True) if "{" in tpl
            ]
            return route, dict(zip(names, values, strict=True)), True
        return None, {}, path_matched

    # --- the aiohttp handler --------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["tail"]
        body, attachments, body_error = await self._read_body(request)
        route, params, path_matched = self._match(request.method, path)
        record = RequestRecord(
            seq=len(self.records) + 1,
            method=request.method,
            path=path,
            route=None if route is None else route.template,
            params=params,
            query=dict(request.query),
            body=body,
            headers=dict(request.headers),
            at=self.world.clock.now(),
            files=attachments,
        )
        self.records.append(record)
        self._notify()
        response = await self._process(request, record, route, path_matched, body_error, attachments)
        record.status = response.status
        record.response = response.body
        self._notify()
        return self._to_web(response, record)

    async def _process(
        self,
        request: web.Request,
        record: RequestRecord,
        route: _Route | None,
        path_matched: bool,
        body_error: DiscordAPIError | None,
        attachments: list[JsonDict],
    ) -> FakeResponse:
        if route is None:
            record.outcome = "unhandled"
            self.unhandled.append(record)
            if path_matched:
                return FakeResponse.error(405, 0, "405: Method Not Allowed")
            return FakeResponse.from_api_error(not_found())
        if route.auth and request.headers.get("Authorization") != f"Bot {self.world.token}":
            record.outcome = "unauthorized"
            return FakeResponse.from_api_error(unauthorized())
        injected = await self._run_hooks(record, "before")
        if injected is not None:
            record.outcome = "injected"
            return injected
        if body_error is not None:
            record.outcome = "error"
            response = FakeResponse.from_api_error(body_error)
        else:
            call = _Call(
                world=self.world,
                record=record,
                params=record.params,
                query=record.query,
                body=record.json,
                attachments=attachments,
                api=self,
            )
            try:
                response = route.handler(call)
                record.outcome = "ok"
            except DiscordAPIError as error:
                record.outcome = "error"
                response = FakeResponse.from_api_error(error)
        replaced = await self._run_hooks(record, "after_effect")
        if replaced is not None:
            record.outcome = "injected"
            return replaced
        return response

    async def _read_body(self, request: web.Request) -> tuple[Any, list[JsonDict], DiscordAPIError | None]:
        if not request.can_read_body:
            return None, [], None
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            payload: Any = None
            attachments: list[JsonDict] = []
            for name, value in form.items():
                if name == "payload_json" and isinstance(value, str):
                    with contextlib.suppress(ValueError):
                        payload = json.loads(value)
                elif isinstance(value, web.FileField):
                    data = value.file.read()
                    attachments.append(
                        {
                            "id": str(self.world.ids.next()),
                            "filename": value.filename,
                            "size": len(data),
                            "content_type": value.content_type,
                            "url": f"https://cdn.invalid/attachments/{value.filename}",
                            "proxy_url": f"https://media.invalid/attachments/{value.filename}",
                        }
                    )
            return payload, attachments, None
        raw = await request.read()
        if not raw:
            return None, [], None
        try:
            return json.loads(raw), [], None
        except ValueError:
            return (
                raw.decode("utf-8", "replace"),
                [],
                DiscordAPIError(400, 50109, "The request body contains invalid JSON."),
            )

    def _to_web(self, response: FakeResponse, record: RequestRecord) -> web.StreamResponse:
        headers = dict(response.headers)
        headers.setdefault("Via", "1.1 google")
        if response.status != 429 and record.route is not None:
            bucket = hashlib.sha1(f"{record.method} {record.route}".encode()).hexdigest()[:16]
            headers.setdefault("X-RateLimit-Bucket", bucket)
            headers.setdefault("X-RateLimit-Limit", "50")
            headers.setdefault("X-RateLimit-Remaining", "49")
            headers.setdefault("X-RateLimit-Reset", f"{self.world.clock.now() + 1:.3f}")
            headers.setdefault("X-RateLimit-Reset-After", "1.000")
        if response.body is None or response.status == 204:
            return web.Response(status=response.status, headers=headers)
        headers["Content-Type"] = "application/json"  # exactly: discord.py compares the header verbatim
        return web.Response(status=response.status, body=json.dumps(response.body).encode(), headers=headers)

    # --- routes ---------------------------------------------------------------------------------------------

    def _register_routes(self) -> None:
        world = self.world
        route = self.route

        @route("GET", "/gateway", auth=False)
        def get_gateway(call: _Call) -> FakeResponse:
            return call.ok({"url": self.gateway_url})

        @route("GET", "/gateway/bot")
        def get_gateway_bot(call: _Call) -> FakeResponse:
            return call.ok(
                {
                    "url": self.gateway_url,
                    "shards": self.recommended_shards,
                    "session_start_limit": {
                        "total": 1000,
                        "remaining": 999,
                        "reset_after": 86_400_000,
                        "max_concurrency": 1,
                    },
                }
            )

        @route("GET", "/users/@me")
        def get_me(call: _Call) -> FakeResponse:
            return call.ok(
                {**world.bot.payload(), "verified": True, "mfa_enabled": False, "flags": 0, "email": None}
            )

        @route("GET", "/users/{user_id}")
        def get_user(call: _Call) -> FakeResponse:
            user = world.users.get(call.param_id("user_id"))
            if user is None:
                raise unknown_user()
            return call.ok(user.payload())

        @route("POST", "/users/@me/channels")
        def create_dm(call: _Call) -> FakeResponse:
            user = world.users.get(as_int(call.body.get("recipient_id")) or 0)
            if user is None:
                raise unknown_user()
            channel = world.dm_channel(user)
            return call.ok(channel.payload())

        @route("GET", "/oauth2/applications/@me")
        def get_application(call: _Call) -> FakeResponse:
            return call.ok(world.application_payload())

        route("GET", "/applications/@me")(get_application)

        @route("GET", "/channels/{channel_id}")
        def get_channel(call: _Call) -> FakeResponse:
            return call.ok(world.channel(call.param_id("channel_id")).payload())

        @route("GET", "/channels/{channel_id}/messages")
        def list_messages(call: _Call) -> FakeResponse:
            channel = world.channel(call.param_id("channel_id"))
            try:
                limit = int(call.query.get("limit", "50"))
                before, after, around = (as_int(call.query.get(k)) for k in ("before", "after", "around"))
            except ValueError:
                raise invalid_form("limit", "NUMBER_TYPE_COERCE", "Value is not int.") from None
            msgs = world.history(channel, limit=limit, before=before, after=after, around=around)
            return call.ok([world.message_payload(m) for m in msgs])

        @route("POST", "/channels/{channel_id}/messages")
        def create_message(call: _Call) -> FakeResponse:
            channel = world.channel(call.param_id("channel_id"))
            body = call.body
            content = body.get("content")
            if content is not None and not isinstance(content, str):
                raise invalid_form("content", "STRING_TYPE_CONVERT", "Could not interpret value as string.")
            allowed = body.get("allowed_mentions") or {}
            reference = body.get("message_reference")
            msg, created = world.create_message(
                channel,
                world.bot,
                content=content or "",
                nonce=body.get("nonce"),
                enforce_nonce=bool(body.get("enforce_nonce")),
                components=body.get("components"),
                embeds=body.get("embeds") or ([body["embed"]] if body.get("embed") else None),
                attachments=call.attachments,
                message_reference=reference if isinstance(reference, dict) else None,
                mention_replied_user=bool(allowed.get("replied_user", True)),
                flags=int(body.get("flags") or 0) & _SENDABLE_FLAGS,
            )
            call.record.effect = created
            call.record.deduplicated = not created
            return call.ok(world.message_payload(msg, include_nonce=True))

        @route("GET", "/channels/{channel_id}/messages/{message_id}")
        def get_message(call: _Call) -> FakeResponse:
            channel = world.channel(call.param_id("channel_id"))
            return call.ok(world.message_payload(world.message_in(channel, call.param_id("message_id"))))

        @route("PATCH", "/channels/{channel_id}/messages/{message_id}")
        def edit_message(call: _Call) -> FakeResponse:
            channel = world.channel(call.param_id("channel_id"))
            msg = world.message_in(channel, call.param_id("message_id"))
            world.edit_message(msg, call.body, editor=world.bot, enforce_age_limit=True)
            call.record.effect = True
            return call.ok(world.message_payload(msg))

        @route("DELETE", "/channels/{channel_id}/messages/{message_id}")
        def delete_message(call: _Call) -> FakeResponse:
            channel = world.channel(call.param_id("channel_id"))
            msg = world.message_in(channel, call.param_id("message_id"))
            world.delete_message(msg)
            call.record.effect = True
            return FakeResponse(status=204)

        @route("POST", "/channels/{channel_id}/messages/{message_id}/threads")
        def start_thread(call: _Call) -> FakeResponse:
            channel = world.channel(call.param_id("channel_id"))
            name = call.body.get("name")
            if not isinstance(name, str):
                raise invalid_form("name", "BASE_TYPE_REQUIRED", "This field is required")
            thread = world.create_thread(
                channel,
                call.param_id("message_id"),
                name=name,
                owner=world.bot,
                auto_archive_duration=int(call.body.get("auto_archive_duration") or 1440),
            )
            call.record.effect = True
            return call.ok(thread.payload(), status=201)

        @route("POST", "/channels/{channel_id}/typing")
        def typing(call: _Call) -> FakeResponse:
            world.channel(call.param_id("channel_id"))
            return FakeResponse(status=204)

        def guild_for(call: _Call) -> FakeGuild:
            guild = world.guilds.get(call.param_id("guild_id"))
            if guild is None:
                raise unknown_guild()
            return guild

        @route("GET", "/guilds/{guild_id}")
        def get_guild(call: _Call) -> FakeResponse:
            return call.ok(world.guild_payload(guild_for(call)))

        @route("GET", "/guilds/{guild_id}/channels")
        def get_guild_channels(call: _Call) -> FakeResponse:
            guild = guild_for(call)
            return call.ok([world.channels[c].payload() for c in guild.channel_ids])

        @route("GET", "/guilds/{guild_id}/roles")
        def get_roles(call: _Call) -> FakeResponse:
            return call.ok([r.payload() for r in guild_for(call).roles.values()])

        @route("GET", "/guilds/{guild_id}/members/{member_id}")
        def get_member(call: _Call) -> FakeResponse:
            member = guild_for(call).members.get(call.param_id("member_id"))
            if member is None:
                raise unknown_member()
            return call.ok(member.payload())

        @route("GET", "/guilds/{guild_id}/threads/active")
        def active_threads(call: _Call) -> FakeResponse:
            guild = guild_for(call)
            threads = [
                c.payload()
                for c in world.channels.values()
                if c.is_thread and c.guild_id == guild.id and not c.archived
            ]
            return call.ok({"threads": threads, "members": []})

        @route("POST", "/interactions/{interaction_id}/{interaction_token}/callback", auth=False)
        def interaction_callback(call: _Call) -> FakeResponse:
            result = world.interaction_callback(
                call.param_id("interaction_id"), call.params["interaction_token"], call.body
            )
            call.record.effect = True
            if call.query.get("with_response") in ("1", "true", "True"):
                return call.ok(result)
            return FakeResponse(status=204)

        @route("POST", "/webhooks/{application_id}/{interaction_token}", auth=False)
        def create_followup(call: _Call) -> FakeResponse:
            record = world.interaction_for_webhook(
                call.param_id("application_id"), call.params["interaction_token"]
            )
            msg = world.create_followup(record, call.body)
            call.record.effect = True
            if call.query.get("wait") in ("1", "true", "True"):
                return call.ok(world.message_payload(msg))
            return FakeResponse(status=204)

        def webhook_message(call: _Call) -> tuple[InteractionRecord, FakeMessage]:
            record = world.interaction_for_webhook(
                call.param_id("application_id"), call.params["interaction_token"]
            )
            return record, world.webhook_message(record, call.params["message_id"])

        @route("GET", "/webhooks/{application_id}/{interaction_token}/messages/{message_id}", auth=False)
        def get_webhook_message(call: _Call) -> FakeResponse:
            _, msg = webhook_message(call)
            return call.ok(world.message_payload(msg))

        @route("PATCH", "/webhooks/{application_id}/{interaction_token}/messages/{message_id}", auth=False)
        def edit_webhook_message(call: _Call) -> FakeResponse:
            _, msg = webhook_message(call)
            world.edit_message(msg, call.body, editor=None, enforce_age_limit=False)
            call.record.effect = True
            return call.ok(world.message_payload(msg))

        @route("DELETE", "/webhooks/{application_id}/{interaction_token}/messages/{message_id}", auth=False)
        def delete_webhook_message(call: _Call) -> FakeResponse:
            _, msg = webhook_message(call)
            world.delete_message(msg)
            call.record.effect = True
            return FakeResponse(status=204)
