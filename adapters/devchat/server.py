"""The devchat web server: the page, its static files, `/healthz`, and the `/ws` websocket.

Websocket protocol (JSON text frames). The page speaks first:

    -> {"type": "hello", "cursor": 41 | null, "epoch": "..." | null}
    <- {"type": "snapshot", "epoch", "cursor", "channels", "messages", "bot", "answer"}  (no usable cursor)
    <- {"type": "events", "cursor", "events": [...], "resumed": true}           (resumed from the cursor)
    <- {"type": "panel", "tasks": [...], "approvals": [...], "scheduling"}      (now, and whenever it changes)
    <- {"type": "events", "cursor", "events": [{"seq", "type": "message" | "channel", ...}]}   (live)

    -> {"type": "post", "name", "channel", "thread": id | null, "text", "client_id"}
    <- {"type": "ack", "client_id", "message_id", "outcome"}   after the chat store AND the harness committed
    <- {"type": "nack", "client_id", "text"}                   stored, not yet handed to the bot (resend later)
    -> {"type": "click", "name", "gate", "approve": bool}
    <- {"type": "notice", "level": "info" | "error", "text", "gate"}   to the clicking page only
    -> {"type": "channel", "name", "channel"}                  create a channel
    -> {"type": "retry", "name", "task"}                       retry a parked task

A post is stored once per `client_id` (a page that lost its connection before the ack sends it again) and handed
to the bridge (exactly once per message id) before the ack. Events carry their sequence number; a page keeps the
last one and resumes from it after a reconnect (or gets a snapshot when the gap is gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from aiohttp import WSMsgType, web
from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator

from adapters.bridge import ApprovalDoc, Bridge, PayloadTooDeep, Place, PlaceOfDoc, valid_payload
from adapters.bridge.approvals import GATE_TASK
from adapters.bridge.text import incident_id, neutralize_bidi, neutralize_value
from adapters.devchat.options import CHANNEL_NAME, DevchatOptions, clean_name
from adapters.devchat.store import ChatStore
from adapters.devchat.transport import PLATFORM, DevchatTransport
from harness_core import HarnessError, Publication, Task
from harness_core.messages import AssistantMessage

TOKEN_COOKIE = "devchat_token"
log = logging.getLogger("adapters.devchat")

STATIC = Path(__file__).with_name("static")
QUEUE_LIMIT = 2_000  # frames waiting for one page; a page further behind is disconnected and resumes
MAX_TEXT = 8_000
PANEL_POLL = 1.0  # seconds; the panel also refreshes on every task or approval commit
PANEL_MIN_GAP = 0.2
Id = Annotated[int, Field(ge=0, le=2**63 - 1)]  # what SQLite can hold: a larger one is refused, not an error


class Hello(BaseModel):
    type: Literal["hello"]
    cursor: Id | None = None
    epoch: str | None = None


class Post(BaseModel):
    type: Literal["post"]
    name: str
    channel: str
    thread: Id | None = None
    text: str = Field(max_length=MAX_TEXT)
    client_id: str = Field(min_length=8, max_length=64)


class Click(BaseModel):
    type: Literal["click"]
    name: str
    gate: Id
    action: Literal["approve", "deny", "withdraw"] | None = None
    approve: bool | None = None  # older pages: true/false for approve/deny

    @model_validator(mode="after")
    def _says_what(self) -> Click:
        if self.action is None and self.approve is None:
            raise ValueError("a click needs an action: approve, deny or withdraw")
        return self

    @property
    def verb(self) -> Literal["approve", "deny", "withdraw"]:
        if self.action is not None:
            return self.action
        return "approve" if self.approve else "deny"


class NewChannel(BaseModel):
    type: Literal["channel"]
    name: str
    channel: str


class Retry(BaseModel):
    type: Literal["retry"]
    name: str
    task: Id


Incoming = TypeAdapter(Annotated[Hello | Post | Click | NewChannel | Retry, Field(discriminator="type")])

REFUSALS = {
    "not_an_approver": "{name} is not an approver for this request",
    "self_approval": "you asked for this; another approver has to decide",
    "already_decided": "already {status} by {by}{at}",
    "not_the_requester": "only the person who asked ({requester}) can withdraw it",
    "expired": "this request expired before your click",  # also when the gate had already expired
    "unknown_gate": "this approval request does not exist",
}


@dataclass(eq=False)
class Client:
    ws: web.WebSocketResponse
    queue: asyncio.Queue[str | None] = field(default_factory=lambda: asyncio.Queue(QUEUE_LIMIT))
    subscribed: bool = False

    def send(self, payload: dict[str, Any]) -> bool:
        try:
            self.queue.put_nowait(json.dumps(payload))
            return True
        except asyncio.QueueFull:
            # Too far behind: drop what is queued and close; the page reconnects and resumes from its cursor.
            self.subscribed = False
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)
            return False


def place_label(place: dict[str, Any] | None) -> str | None:
    if not place:
        return None
    where = Place.from_json(place)
    label = f"#{where.channel}" if where.platform == "devchat" else f"{where.platform}:{where.channel}"
    return label if where.thread is None else f"{label} › thread {where.thread}"


class DevchatServer:
    def __init__(
        self, options: DevchatOptions, store: ChatStore, transport: DevchatTransport, bridge: Bridge
    ) -> None:
        self.options = options
        self.store = store
        self.transport = transport
        self.bridge = bridge
        self.clients: set[Client] = set()
        self.intake_lock = asyncio.Lock()  # store + intake in id order, so catch-up's "after" never skips one
        self.runner: web.AppRunner | None = None
        self.url = ""
        self._panel_dirty = asyncio.Event()
        self._panel: dict[str, Any] | None = None
        self._panel_task: asyncio.Task[None] | None = None
        self._dispose: Any = None
        self._closing = False

    # --- lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._index)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/ws", self._websocket)
        app.router.add_static("/static", STATIC, show_index=False, follow_symlinks=False)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.options.host, self.options.port)
        try:
            await site.start()
        except BaseException:
            await self.runner.cleanup()
            self.runner = None
            raise
        port = int(self.runner.addresses[0][1])
        host = self.options.host if ":" not in self.options.host else f"[{self.options.host}]"
        self.url = f"http://{host}:{port}/"
        self.store.listeners.append(self._broadcast)
        self._dispose = self.bridge.harness.add_publication_listener(self._on_publication)
        self._panel_task = asyncio.get_running_loop().create_task(self._panel_loop(), name="devchat-panel")
        return self.url

    async def stop(self) -> None:
        self._closing = True
        if self._dispose is not None:
            self._dispose()
            self._dispose = None
        if self._broadcast in self.store.listeners:
            self.store.listeners.remove(self._broadcast)
        for client in list(self.clients):
            client.subscribed = False
            with contextlib.suppress(Exception):
                await client.ws.close(code=1001, message=b"server stopping")
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self._panel_task is not None:
            self._panel_task.cancel()
            await asyncio.gather(self._panel_task, return_exceptions=True)
            self._panel_task = None

    # --- HTTP -------------------------------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """No login, so refuse what a hostile web page could do through the user's browser: a Host that is not
        ours (DNS rebinding) and cross-origin websockets; and keep the page to its own files."""
        hostname = request.host.rsplit(":", 1)[0].strip("[]") if request.host else ""
        allowed = {"127.0.0.1", "localhost", "::1", self.options.host}
        if not self.options.allow_remote and hostname not in allowed:
            raise web.HTTPForbidden(text="unexpected Host header")
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"http://{request.host}":
            raise web.HTTPForbidden(text="cross-origin request refused")
        if self.options.token is not None and request.path != "/healthz":
            given = request.query.get("token") or request.cookies.get(TOKEN_COOKIE) or ""
            if not hmac.compare_digest(given.encode(), self.options.token.encode()):
                raise web.HTTPUnauthorized(
                    text="devchat needs its access token: open /?token=<DEVCHAT_TOKEN>"
                )
            if request.path == "/" and "token" in request.query:
                # Keep the token out of the address bar and history: a cookie carries it from here on.
                redirect = web.HTTPSeeOther("/")
                redirect.set_cookie(TOKEN_COOKIE, self.options.token, httponly=True, samesite="Strict")
                raise redirect
        response: web.StreamResponse = await handler(request)
        response.headers.setdefault(
            "Content-Security-Policy",
            f"default-src 'self'; connect-src 'self' ws://{request.host}; img-src 'self' data:; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        )
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"ok": True, "epoch": self.store.epoch, "cursor": await self.store.last_seq(), "url": self.url}
        )

    # --- websocket --------------------------------------------------------------------------------------------

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        if self._closing:
            raise web.HTTPServiceUnavailable(text="stopping")
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=64 * 1024)
        await ws.prepare(request)
        client = Client(ws)
        self.clients.add(client)
        writer = asyncio.get_running_loop().create_task(self._writer(client), name="devchat-ws-writer")
        try:
            async for frame in ws:
                if frame.type != WSMsgType.TEXT:
                    continue
                await self._handle(client, frame.data)
        finally:
            client.subscribed = False
            self.clients.discard(client)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        return ws

    async def _writer(self, client: Client) -> None:
        while True:
            item = await client.queue.get()
            if item is None:
                await client.ws.close(code=4000, message=b"too far behind; resume from your cursor")
                return
            try:
                await client.ws.send_str(item)
            except (ConnectionError, RuntimeError):
                return

    def _broadcast(self, events: list[dict[str, Any]]) -> None:
        payload = {"type": "events", "cursor": events[-1]["seq"], "events": events}
        for client in list(self.clients):
            if client.subscribed:
                client.send(payload)

    async def _handle(self, client: Client, data: str) -> None:
        # json.loads, not pydantic's parser: that one refuses a lone surrogate (`"\ud83d"`) outright, and a
        # post must be taken in with U+FFFD instead, as on every platform.
        try:
            frame = valid_payload(json.loads(data))
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, PayloadTooDeep
            reason = str(exc) if isinstance(exc, PayloadTooDeep) else "not JSON"
            log.warning("devchat: refused a websocket frame (%d characters): %s", len(data), reason)
            client.send({"type": "error", "text": f"bad message: {reason}"})
            return
        try:
            message = Incoming.validate_python(frame)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            client.send({"type": "error", "text": f"bad message: {where}: {first['msg']}"})
            return
        try:
            if isinstance(message, Hello):
                await self._hello(client, message)
            elif isinstance(message, Post):
                await self._post(client, message)
            elif isinstance(message, Click):
                await self._click(client, message)
            elif isinstance(message, NewChannel):
                await self._new_channel(client, message)
            else:
                await self._retry(client, message)
        except ValueError as exc:
            client.send({"type": "error", "text": str(exc)})
        except Exception as exc:  # e.g. the harness is closing; keep the connection, tell the page
            # The page gets an apology and an id, never the error (paths, class names): the log has it.
            incident = incident_id()
            kind = type(message).__name__
            log.error(
                "devchat: incident %s: %s failed: %s: %s",
                incident,
                kind,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            text = f"Sorry, that {message.type} failed on my side (incident {incident})."
            client.send({"type": "error", "text": text})

    async def _hello(self, client: Client, hello: Hello) -> None:
        async with self.store.lock:  # no write may land between what we read and the subscription
            events = None
            if hello.cursor is not None and hello.epoch == self.store.epoch:
                events = await self.store.events_after(hello.cursor)
            if events is None:
                snapshot = await self.store.snapshot()
                client.send(
                    {
                        "type": "snapshot",
                        "epoch": snapshot.epoch,
                        "cursor": snapshot.cursor,
                        "channels": snapshot.channels,
                        "messages": snapshot.messages,
                        "bot": self.options.bot_name,
                        "answer": self._answer_modes(snapshot.channels),
                    }
                )
            else:
                cursor = events[-1]["seq"] if events else hello.cursor
                client.send({"type": "events", "cursor": cursor, "events": events, "resumed": True})
            client.subscribed = True
        client.send({"type": "panel", **(await self._panel_now())})

    def _answer_modes(self, channels: list[dict[str, Any]]) -> dict[str, Any]:
        """Which messages the bot answers (the bridge's policy), so the page can say whether to mention it."""
        config = self.bridge.config
        return {
            "default": config.default.answer,
            "channels": {
                c["name"]: config.policy(self.transport.place(c["name"], None)).answer for c in channels
            },
        }

    async def _post(self, client: Client, post: Post) -> None:
        name = _name(post.name)
        text = post.text.strip()
        if not text:
            raise ValueError("empty message")
        if not await self.store.has_channel(post.channel):
            raise ValueError(f"no channel #{post.channel}")
        if post.thread is not None:
            parent = await self.store.message(post.thread)
            if parent is None or parent["channel"] != post.channel or parent["thread"] is not None:
                raise ValueError("a thread opens on a top-level message of the same channel")
        async with self.intake_lock:
            message, _ = await self.store.add_human(post.channel, post.thread, name, text, post.client_id)
            try:
                result = await self.bridge.intake(self.transport.incoming(message))
            except HarnessError as exc:
                # Stored but not handed over: the page resends (same client_id) and startup catch-up finds it.
                log.warning("intake of devchat message %s failed: %s", message["id"], exc)
                client.send({"type": "nack", "client_id": post.client_id, "text": "the bot is unavailable"})
                return
        client.send(
            {
                "type": "ack",
                "client_id": post.client_id,
                "message_id": message["id"],
                "outcome": result.outcome,
            }
        )

    async def _click(self, client: Client, click: Click) -> None:
        name = _name(click.name)
        card = await self.store.find_key_anywhere(f"approval:{click.gate}")
        if card is None:  # only gates shown on devchat can be decided from devchat
            self._refuse(client, click.gate, REFUSALS["unknown_gate"])
            return
        verb = click.verb
        if verb != "withdraw" and self.options.approvers is not None and name not in self.options.approvers:
            self._refuse(client, click.gate, REFUSALS["not_an_approver"].format(name=name))
            return
        # The card was found by the gate's own key, so the click is on the gate's own message.
        decision = await self.bridge.decide(
            click.gate, user_id=name, user_name=name, action=verb, platform=PLATFORM
        )
        if decision.accepted:
            done = {"approve": "approved", "deny": "denied", "withdraw": "withdrew"}[verb]
            client.send({"type": "notice", "level": "info", "gate": click.gate, "text": f"you {done} it"})
            return
        reason = decision.reason or ""
        if reason == "already_decided" and decision.status == "expired":
            reason = "expired"  # nobody decided it: "already expired by someone" would be wrong
        template = REFUSALS.get(reason, "refused ({reason})")
        gate = await self.bridge.harness.snapshot(ApprovalDoc, key=str(click.gate)) or {}
        text = template.format(
            name=name,
            status=decision.status,
            by=neutralize_bidi(decision.decided_by or "someone"),
            at="",  # the page appends the time in the reader's clock (decided_at below)
            reason=decision.reason,
            requester=neutralize_bidi((gate.get("requester") or {}).get("user_name") or "someone else"),
        )
        self._refuse(
            client, click.gate, text, decided_at=decision.decided_at if reason == "already_decided" else None
        )

    def _refuse(self, client: Client, gate: int, text: str, *, decided_at: int | None = None) -> None:
        notice: dict[str, Any] = {
            "type": "notice",
            "level": "error",
            "gate": gate,
            "text": f"Refused: {text}",
        }
        if decided_at:
            notice["decided_at"] = decided_at
        client.send(notice)

    async def _new_channel(self, client: Client, request: NewChannel) -> None:
        name = _name(request.name)
        channel = request.channel.strip().lstrip("#").lower()
        if not CHANNEL_NAME.match(channel):
            raise ValueError("a channel name has 1-32 of a-z, 0-9, '-', '_'")
        await self.store.add_channel(channel, name)

    async def _retry(self, client: Client, request: Retry) -> None:
        _name(request.name)
        task = await self.bridge.harness.get_task(request.task)
        if task is not None and not await self._shows(task.conversation_id):
            client.send({"type": "notice", "level": "error", "text": "Retry refused: not a devchat task"})
            return
        try:
            await self.bridge.harness.retry_task(request.task)
        except HarnessError as exc:
            client.send({"type": "notice", "level": "error", "text": f"Retry refused: {exc}"})
            return
        client.send({"type": "notice", "level": "info", "text": f"task {request.task} scheduled again"})
        self._panel_dirty.set()

    # --- the task and approval panel ---------------------------------------------------------------------------

    def _on_publication(self, publication: Publication) -> None:
        if publication.tasks or any(d.record.kind == ApprovalDoc.kind for d in publication.docs):
            self._panel_dirty.set()

    async def _panel_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._panel_dirty.wait(), timeout=PANEL_POLL)
            self._panel_dirty.clear()
            if not any(c.subscribed for c in self.clients):
                continue
            try:
                panel = await self._panel_now()
            except Exception as exc:  # harness closing; try again on the next tick
                log.debug("panel refresh failed: %s", exc)
                await asyncio.sleep(PANEL_POLL)
                continue
            if panel != self._panel:
                self._panel = panel
                for client in list(self.clients):
                    if client.subscribed:
                        client.send({"type": "panel", **panel})
            await asyncio.sleep(PANEL_MIN_GAP)

    async def _shows(self, conversation_id: int) -> bool:
        """Whether the panel shows (and may retry) work of this conversation: devchat's own, or every
        platform's with `all_platforms`."""
        if self.options.all_platforms:
            return True
        place = (await self.bridge.harness.snapshot(PlaceOfDoc, conversation_id) or {}).get("place") or {}
        return bool(place.get("platform") == PLATFORM)

    async def _panel_now(self) -> dict[str, Any]:
        harness = self.bridge.harness
        inspection = await harness.inspect()
        gates = await harness.family(ApprovalDoc)
        places: dict[int, str | None] = {}
        tasks = []
        for item in inspection.tasks:
            task = item.record
            if not await self._shows(task.conversation_id):
                continue
            if task.conversation_id not in places:
                place_of = await harness.snapshot(PlaceOfDoc, task.conversation_id) or {}
                places[task.conversation_id] = place_label(place_of.get("place"))
            label = await _task_label(harness, task, gates)
            tasks.append(
                {
                    "id": task.id,
                    "label": label,
                    "state": item.state,
                    "reason": item.reason,
                    "restarts": task.restarts,
                    "place": places[task.conversation_id] or f"conversation {task.conversation_id}",
                }
            )
        approvals = []
        for key, gate in gates.items():
            target = gate.get("target") or {}
            if not self.options.all_platforms and target.get("platform") != PLATFORM:
                continue
            approvals.append(
                {
                    "gate": int(key),
                    # Names and arguments with bidi controls made visible, as on the cards.
                    "tool": neutralize_value(gate.get("tool")),
                    "arguments": neutralize_value(gate.get("arguments") or {}),
                    "status": gate.get("status"),
                    "requester": neutralize_value((gate.get("requester") or {}).get("user_name")),
                    "decided_by": neutralize_value(gate.get("decided_by")),
                    "decided_at": gate.get("decided_at"),
                    "expires_at": gate.get("expires_at"),
                    "place": place_label(gate.get("target")),
                }
            )
        approvals.sort(key=lambda a: (a["status"] != "pending", -(a["decided_at"] or 0), -a["gate"]))
        return {"scheduling": inspection.scheduling, "tasks": tasks, "approvals": approvals[:20]}


TASK_LABELS = {
    "core.generation": "answering",
    "core.compaction": "summarizing older messages",
    "bridge.scheduled": "reminder",
}


async def _task_label(harness: Any, task: Task, gates: dict[str, dict[str, Any]]) -> str:
    """What a task is, in the reader's terms (no internal kind names on the page)."""
    if task.kind == GATE_TASK:
        gate = gates.get(str(task.input.get("gate"))) or {}
        return f"approval #{task.input.get('gate')}: {gate.get('tool', 'tool')} waits for a decision"
    if task.kind == "core.tool":
        name = await _tool_name(harness, task)
        return f"tool {name}" if name else "a tool"
    return TASK_LABELS.get(task.kind, task.kind.rsplit(".", 1)[-1].replace("-", " "))


async def _tool_name(harness: Any, task: Task) -> str | None:
    entry = await harness.entry(int(task.input.get("assistant", 0) or 0))
    for message in entry.model or () if entry is not None else ():
        for call in message.tool_calls() if isinstance(message, AssistantMessage) else ():
            if call.id == task.input.get("call_id"):
                return str(call.name)
    return None


def _name(raw: str) -> str:
    try:
        return clean_name(raw)
    except ValueError as exc:
        raise ValueError(f"choose a display name first: {exc}") from None
