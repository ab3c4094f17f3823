"""`SlackAdapter`: Slack events in (Socket Mode or the HTTP Events API), the bridge's transport out.

Intake: commit, then acknowledge. The bolt app runs with `process_before_response=True`, so the Socket Mode
ack (or the HTTP 200) goes out only after the listener returned, that is after `bridge.intake` committed the
message. If the process dies before that, Slack sees no ack and redelivers; a listener that raises gets no ack
either (HTTP 500), so Slack retries. Retries are never dropped by their `x-slack-retry-num`: they are normal
deliveries through the bridge's dedupe, which keys on the message (`team:channel:ts`), never on the event id, so
the `message` + `app_mention` pair of one post, and every retry of either, become one input. Events that are
not input (bot posts, hidden subtypes, unknown event types) are acknowledged, or Slack would retry them for
nothing; a bolt "unhandled request" (404) is turned into an ack for the same reason.

HTTP mode reads nothing before the signature headers are there and fresh (401 on the headers alone, the body
left unread), reads at most `max_body` bytes (413 before reading a larger one), then checks the HMAC. A signed
payload that cannot be handled is never answered 500, which would make Slack retry it for an hour: undecodable
(not UTF-8, not JSON, nested too deep) is 400 with `X-Slack-No-Retry: 1`; decodable but of a shape the adapter or
bolt cannot use is 200, logged and dropped. A 500 goes out only when the adapter's own listener failed to
commit a message, so that Slack does redeliver it. Every decoded payload (HTTP and Socket Mode) is made valid
first: a lone surrogate becomes U+FFFD.

Clicks on approval buttons are committed before they are acknowledged, like messages: the clicking user's
groups among the gate's groups are looked up (`usergroups.users.list`, cached briefly), `bridge.decide` checks
the policy and that the click was made on the gate's own message (channel + ts), and commits first writer wins;
only then does the listener return and bolt ack (Slack wants it within 3 s and never redelivers an interaction,
so the decision gets at most `CLICK_BUDGET` seconds before the ack goes out anyway and the decision finishes
in a task the adapter owns). A crash before the commit leaves Slack without an ack, so the clicker sees the
click fail and the buttons still work. Refusals are answered privately (`chat.postEphemeral`) after the ack.
The bridge re-renders the request through `SlackTransport.update_approval`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.async_internals import send_async_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from adapters.bridge import BridgeLike, ClickOrigin, Decision, Place, TransportError, valid_payload
from adapters.bridge.approvals import Action, split_entry
from adapters.bridge.text import neutralize_bidi
from adapters.health import TransportHealth
from adapters.slack._api import SlackPermanentError, call
from adapters.slack._socket import WatchedSocketModeClient
from adapters.slack.blocks import ACTION_PATTERN, parse_action, slack_date
from adapters.slack.config import SlackOptions, SlackSecrets, load_secrets, parse_options
from adapters.slack.directory import Directory
from adapters.slack.events import MalformedEvent, human_message
from adapters.slack.payloads import decode_body, malformed, signature_headers_acceptable, signature_valid
from adapters.slack.safe_text import slack_text
from adapters.slack.transport import SlackTransport

log = logging.getLogger("adapters.slack")

DRAIN_TIMEOUT = 5.0
BODY_TIMEOUT = 10.0  # seconds a signed request may take to send its (small) body

# Set by the HTTP/Socket Mode entry for the request in hand; the message listener records that it raised, so a
# 500 from bolt is told apart: the listener's (not committed: let Slack redeliver) or bolt's own on a payload it
# could not handle (acknowledge, a redelivery would fail the same way).
_LISTENER_FAILURES: ContextVar[list[BaseException] | None] = ContextVar("_LISTENER_FAILURES", default=None)


def slack_group_ids(entries: Any) -> list[str]:
    """The Slack user group ids among a gate's group entries: `slack:S0ONCALL` and bare `S0ONCALL` (the bridge
    lets a bare one count only with one platform running); other platforms' entries are not Slack's to look
    up. Slack knows the group by its bare id only: asked for `slack:S0ONCALL` it finds no such group."""
    ids: list[str] = []
    for entry in entries if isinstance(entries, list) else []:
        platform, group = split_entry(str(entry))
        if platform in (None, "slack") and group not in ids:
            ids.append(group)
    return ids


class _QuietBoltNotices(logging.Filter):
    """Bolt warns on every start that the `client` we pass wins over a token it read from os.environ, and on
    every request no listener takes with the whole payload (user text, any size) in the log line; the adapter
    acknowledges those itself (debug)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("As you gave `client` as well", "Unhandled request ("))


BOLT_LOG = logging.getLogger("adapters.slack.bolt")
BOLT_LOG.addFilter(_QuietBoltNotices())


CLICK_BUDGET = 2.5  # seconds a click may take to commit before the ack goes out anyway (Slack allows 3)

REFUSALS = {
    "not_an_approver": "You are not an approver for `{tool}`, so your click was not counted.",
    "not_the_requester": "Only the person who asked for `{tool}` can withdraw the request.",
    "wrong_message": "This button is not on the approval request it names, so your click was not counted.",
    "self_approval": "You cannot approve or deny your own request for `{tool}`.",
    "unknown_gate": "This approval request is not known (any more).",
    "expired": "This request for `{tool}` expired before your click.",
}


def refusal_text(decision: Decision, tool: str) -> str:
    if decision.reason == "already_decided":
        if decision.status == "expired":
            return f"This request for `{tool}` already expired."
        return (
            f"This request for `{tool}` was already {decision.status} by "
            f"{slack_text(neutralize_bidi(decision.decided_by or 'someone'))} at {slack_date(decision.decided_at)}."
        )
    template = REFUSALS.get(decision.reason or "", "Your click was not counted ({reason}).")
    return template.format(tool=tool, reason=decision.reason)


class SlackAdapter:
    name = "slack"

    def __init__(
        self, options: SlackOptions, secrets: SlackSecrets, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.options = options
        self._secrets = secrets
        self._clock = clock
        self.url: str | None = None  # HTTP mode: the Request URL once started
        self.bridge: BridgeLike | None = None
        self.transport: SlackTransport | None = None
        self.team_id: str | None = None
        self.catch_up_summary: str | None = None  # what the start-up catch-up did (the runtime prints it)
        self.bot_user_id: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._client: AsyncWebClient | None = None
        self._app: AsyncApp | None = None
        self._socket: WatchedSocketModeClient | None = None
        self._health = TransportHealth("slack")  # Socket Mode connections (HTTP mode holds none)
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # click decisions (owned, drained in stop())
        self._inflight: set[asyncio.Task[Any]] = set()  # Socket Mode requests being handled (slack-sdk tasks)
        self._stopping = False

    def __repr__(self) -> str:  # never show secrets
        return f"SlackAdapter(mode={self.options.mode!r}, url={self.url!r})"

    def health(self) -> TransportHealth:
        """Socket Mode: connections opened, reconnects, stale (deaf) connections detected (a copy)."""
        return self._health.copy()

    @property
    def listening(self) -> bool:
        """Whether this process takes Slack events in (False: its separate intake process does)."""
        return self.options.listen

    @property
    def socket_refused(self) -> bool:
        """Socket Mode: Slack refused this worker's connection because the app already holds ten (one per
        worker); it keeps asking slowly and takes no Slack events until a slot frees."""
        return self._socket is not None and self._socket.refused

    # --- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self, bridge: BridgeLike) -> None:
        """Connect (auth.test), attach the transport, catch up on missed messages, then start intake."""
        self.bridge = bridge
        self._stopping = False
        self._session = aiohttp.ClientSession()
        # No retry handlers: a re-sent chat.postMessage after a lost response would post twice. Failures reach
        # the bridge, which reconciles by metadata before posting again and honours Retry-After.
        self._client = AsyncWebClient(
            token=self._secrets.bot_token,
            base_url=self._secrets.api_url,
            session=self._session,
            retry_handlers=[],
            logger=logging.getLogger("adapters.slack.sdk"),
        )
        try:
            auth = await call("auth.test", self._client.auth_test())
            self.team_id = str(auth["team_id"])
            self.bot_user_id = str(auth["user_id"])
            bot_id = auth.get("bot_id")
            governor = bridge.governor("slack")
            directory = Directory(
                self._client,
                governor,
                user_ttl=self.options.user_cache_ttl,
                group_ttl=self.options.group_cache_ttl,
                lookup_timeout=self.options.lookup_timeout,
            )
            self.transport = SlackTransport(
                self._client,
                options=self.options,
                directory=directory,
                governor=governor,
                team_id=self.team_id,
                bot_user_id=self.bot_user_id,
                bot_id=str(bot_id) if bot_id else None,
                bridge=bridge,
            )
            bridge.attach(self.transport)
            self._app = self._build_app()
            log.info(
                "Slack: connected to team %s as %s (%s mode)",
                self.team_id,
                self.bot_user_id,
                self.options.mode,
            )
            if self.options.catch_up:
                await self._catch_up()
            if not self.options.listen:
                pass  # another process takes this worker's events in (its separate intake)
            elif self.options.mode == "socket":
                await self._start_socket()
            else:
                await self._start_http()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop intake, let requests in flight finish (their acks still go out), close connections.

        Socket Mode: envelopes arriving from now on are left unacknowledged (Slack redelivers them to a live
        connection, or to this bot after its restart); those already being handled finish and are acked before
        the socket closes. HTTP: the server stops accepting and answers the requests it has."""
        self._stopping = True
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=DRAIN_TIMEOUT)
        if self._socket is not None:
            socket, self._socket = self._socket, None
            try:
                await socket.close()
            except Exception as exc:
                log.warning("closing the Socket Mode connection failed: %s", exc)
            self._health.lost()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=DRAIN_TIMEOUT)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self.transport is not None:
            self.transport.close()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _catch_up(self) -> None:
        """Known places from their last message seen; every other conversation the bot is in (a mention in a
        channel nobody used with the bot yet, posted while it was down) back to the look-back bound."""
        assert self.bridge is not None and self.transport is not None and self.team_id is not None
        places = [p for p in await self.bridge.known_places("slack") if p.workspace == self.team_id]
        first_after: str | None = None
        hours = self.options.catch_up_hours
        if hours > 0:
            since_ms = await self.bridge.watching_since("slack", self.team_id)
            cutoff_ms = max(int(time.time() * 1000 - hours * 3_600_000), since_ms)
            first_after = f"{cutoff_ms // 1000}.{cutoff_ms % 1000:03d}000"
            known = {p.channel for p in places if p.thread is None}
            for channel in await self.transport.member_channels():
                if channel not in known:
                    places.append(Place("slack", self.team_id, channel))
        count = await self.bridge.catch_up(self.transport, places, first_after=first_after)
        channels = len({p.channel for p in places})
        self.catch_up_summary = f"caught up {count} message(s) in {channels} channel(s)"
        log.info("Slack: %s", self.catch_up_summary)

    # --- bolt ---------------------------------------------------------------------------------------------------

    def _build_app(self) -> AsyncApp:
        app = AsyncApp(
            client=self._client,
            name="durable-bots",
            signing_secret=self._secrets.signing_secret or "",
            process_before_response=True,  # the ack goes out after the listener: commit, then ack
            # HTTP mode: `_on_http_request` verified the raw bytes before anything else; bolt gets the payload
            # made valid (re-encoded), whose bytes no longer carry Slack's signature.
            request_verification_enabled=False,
            logger=BOLT_LOG,
        )
        app.event("message")(self._on_message)
        app.event("app_mention")(self._on_message)
        app.action(ACTION_PATTERN)(self._on_gate_click)
        app.error(self._on_bolt_error)
        return app

    async def _on_bolt_error(self, error: Exception) -> None:
        """Bolt's error handler (it answers 500 after this). Our listener's failure is the one worth a traceback
        (a message not committed: Slack redelivers it); anything else is bolt choking on a payload's shape, one
        line, and the request is acknowledged."""
        if _LISTENER_FAILURES.get():
            log.error("Slack: taking in a message failed; Slack will redeliver it", exc_info=error)
        else:
            log.warning("Slack: a payload bolt could not handle: %s: %s", type(error).__name__, error)

    async def _on_message(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        """`message` and `app_mention`: commit the input; returning lets bolt ack. Raising means no ack."""
        try:
            await self._take_in(body, event)
        except BaseException as exc:
            failures = _LISTENER_FAILURES.get()
            if failures is not None:
                failures.append(exc)
            raise

    async def _take_in(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        bridge, transport = self.bridge, self.transport
        assert bridge is not None and transport is not None and self.bot_user_id is not None
        try:
            human = human_message(event, bot_user_id=self.bot_user_id, bot_id=transport.bot_id)
        except MalformedEvent as exc:
            # Acknowledged: a retry of the same malformed event cannot succeed either.
            log.warning("ignoring a malformed %s event %s: %s", event.get("type"), body.get("event_id"), exc)
            return
        if human is None:
            return
        mention_event = event.get("type") == "app_mention"  # never sent for DMs
        incoming = await transport.incoming(human, is_dm=False if mention_event else None)
        result = await bridge.intake(incoming)
        log.debug(
            "intake %s via %s %s: %s",
            incoming.request_id,
            event.get("type"),
            body.get("event_id"),
            result.outcome,
        )

    async def _on_gate_click(
        self, ack: Any, body: dict[str, Any], action: dict[str, Any], respond: Any
    ) -> None:
        parsed = parse_action(str(action.get("action_id") or ""))
        if parsed is None:
            await ack()
            return
        verb, gate_id = parsed
        deciding = asyncio.get_running_loop().create_task(
            self._decide(body, gate_id, verb, respond), name=f"slack-gate-click-{gate_id}"
        )
        self._tasks.add(deciding)
        deciding.add_done_callback(self._task_done)
        # Commit before ack, within Slack's 3 s: wait for the decision (shielded: a slow group lookup goes on
        # in the owned task after the budget, and stop() drains it).
        await asyncio.wait({deciding}, timeout=CLICK_BUDGET)
        await ack()

    def _spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("Slack: %s failed", task.get_name(), exc_info=task.exception())

    async def _decide(self, body: dict[str, Any], gate_id: int, verb: Action, respond: Any) -> None:
        bridge, transport = self.bridge, self.transport
        assert bridge is not None and transport is not None
        user, container, where = (_object(body.get(key)) for key in ("user", "container", "channel"))
        user_id = str(user.get("id") or "")
        channel = str(where.get("id") or container.get("channel_id") or "")
        thread = container.get("thread_ts")
        clicked_ts = str(container.get("message_ts") or (body.get("message") or {}).get("ts") or "")
        gate = await bridge.gate_doc(gate_id) or {}
        tool = str(gate.get("tool") or "the tool")
        name = await transport.directory.name(user_id, fallback=user.get("name"))
        groups: list[str] = []
        needs_groups = (
            verb != "withdraw"
            and gate.get("status") == "pending"
            and bool(gate.get("groups"))
            and user_id not in (gate.get("approvers") or [])
        )
        if needs_groups:
            try:
                groups = await transport.directory.groups_of(user_id, slack_group_ids(gate["groups"]))
            except (TransportError, SlackPermanentError) as exc:
                log.warning("could not read user groups for a click on gate %s: %s", gate_id, exc)
                self._spawn(
                    self._tell(
                        channel,
                        user_id,
                        thread,
                        respond,
                        "I could not check your Slack user groups; please try again.",
                    ),
                    name=f"slack-gate-tell-{gate_id}",
                )
                return
        decision = await bridge.decide(
            gate_id,
            user_id=user_id,
            user_name=name,
            action=verb,
            user_groups=groups,
            origin=ClickOrigin(channel, clicked_ts),
            platform="slack",
        )
        log.info(
            "Slack: %s clicked %s on gate %s: %s",
            user_id,
            verb,
            gate_id,
            "accepted" if decision.accepted else decision.reason,
        )
        if not decision.accepted:
            # After the ack: the private answer is not part of the commit.
            self._spawn(
                self._tell(channel, user_id, thread, respond, refusal_text(decision, tool)),
                name=f"slack-gate-tell-{gate_id}",
            )

    async def _tell(self, channel: str, user: str, thread: Any, respond: Any, text: str) -> None:
        """A private answer to a click: an ephemeral message, or the click's response_url if that fails."""
        assert self._client is not None
        try:
            await call(
                "chat.postEphemeral",
                self._client.chat_postEphemeral(
                    channel=channel,
                    user=user,
                    text=text,
                    thread_ts=thread if isinstance(thread, str) else None,
                ),
            )
            return
        except (TransportError, SlackPermanentError) as exc:
            log.warning("chat.postEphemeral failed (%s); answering through the response_url", exc)
        try:
            await respond(text=text, response_type="ephemeral", replace_original=False)
        except Exception as exc:
            log.warning("could not answer a refused click privately: %s", exc)

    # --- Socket Mode --------------------------------------------------------------------------------------------

    async def _start_socket(self) -> None:
        assert self._app is not None and self._client is not None and self._secrets.app_token is not None
        client = WatchedSocketModeClient(
            app_token=self._secrets.app_token,
            web_client=self._client,
            ping_interval=self.options.ping_interval,
            health=self._health,
            logger=logging.getLogger("adapters.slack.socket"),
        )
        # What bolt's AsyncSocketModeHandler does, except that a request no listener handled (404) is still
        # acknowledged, and that the client is watched (see _socket.py).
        client.socket_mode_request_listeners.append(self._on_socket_request)
        self._socket = client
        # slack-sdk's connect loop retries a refused apps.connections.open forever: a wrong SLACK_APP_TOKEN
        # would leave a bot that never hears anything. Ask for the first URL here and fail loudly on a refusal;
        # a transient failure is left to the loop (with the watched client's backoff).
        try:
            opened = await call(
                "apps.connections.open", self._client.apps_connections_open(app_token=client.app_token)
            )
            client.wss_uri = str(opened["url"])
        except SlackPermanentError as exc:
            raise SlackPermanentError(
                exc.method,
                f"{exc.error} (SLACK_APP_TOKEN must be an app-level token, xapp-…, with connections:write)",
            ) from None
        except TransportError as exc:
            log.warning("Slack: apps.connections.open failed (%s); retrying", exc)
        await client.connect()  # type: ignore[no-untyped-call]

    async def _on_socket_request(self, client: Any, req: Any) -> None:
        # slack-sdk runs each envelope in a task it keeps no reference to: hold one, and drain them at stop().
        task = asyncio.current_task()
        if task is None or self._stopping:
            return  # not acknowledged: Slack redelivers
        self._inflight.add(task)
        try:
            await self._handle_socket_request(client, req)
        finally:
            self._inflight.discard(task)

    async def _handle_socket_request(self, client: Any, req: Any) -> None:
        assert self._app is not None
        started = time.time()
        headers: dict[str, str | Sequence[str]] = {}
        if req.retry_attempt is not None:
            headers["x-slack-retry-num"] = str(req.retry_attempt)
        if req.retry_reason is not None:
            headers["x-slack-retry-reason"] = req.retry_reason
        try:
            payload = valid_payload(req.payload)
            problem = malformed(payload)
            request = (
                None
                if problem
                else AsyncBoltRequest(mode="socket_mode", body=payload, headers=headers or None)
            )
        except Exception as exc:  # PayloadTooDeep, or bolt choking on the shape while reading it
            problem, request = f"{type(exc).__name__}: {exc}", None
        if request is None:
            log.warning("acknowledging a malformed %s envelope: %s", req.type, problem)
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))
            return
        response = await self._dispatch(request)
        if response is None:
            log.warning("acknowledging a %s envelope the app could not handle (malformed payload)", req.type)
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))
            return
        if response.status == 404:
            log.debug("acknowledging an unhandled %s envelope", req.type)
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))
            return
        await send_async_response(client, req, response, started)

    async def _dispatch(self, request: AsyncBoltRequest) -> BoltResponse | None:
        """Bolt's answer, or None when bolt failed on the payload itself (it answers 500, or even raises from
        its error handling): acknowledge, a redelivery would fail the same way. When our own listener failed
        (nothing committed), bolt's 500 stands, so Slack redelivers."""
        assert self._app is not None
        failures: list[BaseException] = []
        token = _LISTENER_FAILURES.set(failures)
        try:
            response = await self._app.async_dispatch(request)
        except Exception as exc:
            if failures:
                raise
            log.warning("Slack: a payload bolt could not handle: %s: %s", type(exc).__name__, exc)
            return None
        finally:
            _LISTENER_FAILURES.reset(token)
        if response.status >= 500 and not failures:
            return None
        return response

    # --- HTTP Events API ----------------------------------------------------------------------------------------

    async def _start_http(self) -> None:
        web_app = web.Application(client_max_size=self.options.max_body)
        web_app.router.add_post(self.options.path, self._on_http_request)
        runner = web.AppRunner(web_app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.options.host, self.options.port)
        await site.start()
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.url = f"http://{host}:{port}{self.options.path}"
        log.info("Slack: listening for events on %s", self.url)

    async def _on_http_request(self, request: web.Request) -> web.StreamResponse:
        """Signature headers first (401, the body unread), size (413), the HMAC over the bytes read (401), then
        decode (400 + `X-Slack-No-Retry`), then the shape (200, dropped), then bolt.

        An undecodable body that carries a valid signature gets 400 with `X-Slack-No-Retry: 1`: it is not UTF-8
        JSON or form data, so there is nothing to store, and the same bytes would fail again on every retry.
        A decodable payload with a broken event is acknowledged (logged), since a retry of it cannot succeed
        either."""
        assert self._app is not None and self._secrets.signing_secret is not None
        timestamp = request.headers.get("X-Slack-Request-Timestamp")
        signature = request.headers.get("X-Slack-Signature")
        if not signature_headers_acceptable(timestamp, signature, self._clock()):
            return self._unsigned(request)
        if self._stopping:
            return web.Response(status=503, text="stopping")
        limit = self.options.max_body
        declared = request.content_length
        try:
            raw = None if declared is not None and declared > limit else await self._read_body(request, limit)
        except TimeoutError:
            log.warning("refused a request whose body did not arrive within %gs", BODY_TIMEOUT)
            return _closing(web.Response(status=408, text="body too slow"))
        if raw is None:
            log.warning(
                "refused a request body over %d bytes (declared %s) from %s", limit, declared, request.remote
            )
            return _closing(
                web.Response(status=413, text="body too large", headers={"X-Slack-No-Retry": "1"})
            )
        if not signature_valid(self._secrets.signing_secret, raw, timestamp, signature, self._clock()):
            return self._unsigned(request)
        headers: dict[str, str | Sequence[str]] = {}
        for key, value in request.headers.items():
            previous = headers.get(key.lower())
            headers[key.lower()] = [value] if previous is None else [*previous, value]
        try:
            body = decode_body(raw, request.content_type)
        except ValueError as exc:  # UnicodeDecodeError, json.JSONDecodeError, PayloadTooDeep
            log.warning("rejected a signed but undecodable request body (%d bytes): %s", len(raw), exc)
            return web.Response(status=400, text="malformed body", headers={"X-Slack-No-Retry": "1"})
        problem = malformed(body)
        if problem is None:
            try:
                bolt_request = AsyncBoltRequest(
                    body=json.dumps(body), query=request.query_string, headers=dict(headers)
                )
            except Exception as exc:  # bolt reads the team, user and enterprise out of the payload
                problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            log.warning("acknowledging a malformed request: %s", problem)
            return web.Response(status=200)
        response = await self._dispatch(bolt_request)
        if response is None:
            log.warning("acknowledging a request the app could not handle (malformed payload)")
            return web.Response(status=200)
        if response.status == 404:
            log.debug("acknowledging an unhandled request")
            return web.Response(status=200)
        result: web.Response = await to_aiohttp_response(response)
        return result

    def _unsigned(self, request: web.Request) -> web.Response:
        log.warning("rejected a request with a missing, stale or invalid signature from %s", request.remote)
        return _closing(web.Response(status=401, text="invalid signature"))

    async def _read_body(self, request: web.Request, limit: int) -> bytes | None:
        """The body, or None once it passes `limit` bytes (never more than that is held)."""
        chunks: list[bytes] = []
        size = 0
        async with asyncio.timeout(BODY_TIMEOUT):
            while chunk := await request.content.read(64 * 1024):
                size += len(chunk)
                if size > limit:
                    return None
                chunks.append(chunk)
        return b"".join(chunks)


def _object(value: Any) -> dict[str, Any]:
    """A payload field that should be an object, or {} when it is anything else."""
    return value if isinstance(value, dict) else {}


def _closing(response: web.Response) -> web.Response:
    """Close the connection after answering: the body left unread is discarded with it, not drained."""
    response.force_close()
    return response


def create(options: Mapping[str, Any], env: Mapping[str, str]) -> SlackAdapter:
    """Build the adapter from the `[adapters.slack]` table and the environment (secrets only from there)."""
    parsed = parse_options(options)
    return SlackAdapter(parsed, load_secrets(parsed, env))
