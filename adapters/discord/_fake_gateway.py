"""The fake gateway: HELLO, IDENTIFY/READY, RESUME, heartbeats, dispatch with sequence numbers, compression.

One :class:`GatewaySession` per successful IDENTIFY. A session outlives its websocket: when the connection
drops without a clean client close (1000/1001), the session keeps numbering and logging events, and a RESUME
within ``resume_timeout`` replays what was missed (like Discord). A fresh IDENTIFY starts a new session and
replays nothing, so events that happened while no client was connected are only in REST history.

Transport compression: discord.py asks for ``compress=zlib-stream`` (or ``zstd-stream`` when ``zstandard`` or
Python 3.14's ``compression.zstd`` is importable). ``zlib-stream`` is one zlib compressor per connection with
every frame ending in a Z_SYNC_FLUSH; ``zstd-stream`` is one zstd stream with every frame block-flushed. If
the fake cannot produce the requested stream (no zstd module here) it sends uncompressed text frames, which
discord.py accepts whatever it asked for (it only decompresses binary frames).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import secrets
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from aiohttp import WSMsgType, web

from adapters.discord._fake_models import (
    ALL_INTENT_BITS,
    PRIVILEGED_INTENTS,
    GatewayIntent,
    JsonDict,
)
from adapters.discord._fake_state import EventBuilder, World

_log = logging.getLogger(__name__)

# Close codes (Discord gateway)
UNKNOWN_ERROR = 4000
UNKNOWN_OPCODE = 4001
DECODE_ERROR = 4002
NOT_AUTHENTICATED = 4003
AUTHENTICATION_FAILED = 4004
ALREADY_AUTHENTICATED = 4005
INVALID_SHARD = 4010
INVALID_API_VERSION = 4012
INVALID_INTENTS = 4013
DISALLOWED_INTENTS = 4014
_SESSION_ENDING_CLOSE_CODES = {1000, 1001, 4004, 4007, 4009, 4010, 4011, 4012, 4013, 4014}

SessionState = Literal["connected", "detached", "invalidated"]


class _Compressor(Protocol):
    mode: str

    def frame(self, text: str) -> bytes | str: ...


class _Plain:
    mode = "none"

    def frame(self, text: str) -> bytes | str:
        return text


class _ZlibStream:
    mode = "zlib-stream"

    def __init__(self) -> None:
        self._compressor = zlib.compressobj()

    def frame(self, text: str) -> bytes | str:
        data = text.encode()
        return self._compressor.compress(data) + self._compressor.flush(zlib.Z_SYNC_FLUSH)


class _ZstdStream:
    mode = "zstd-stream"

    def __init__(self, module_name: str) -> None:
        module: Any = importlib.import_module(module_name)
        self._module_name = module_name
        if module_name == "zstandard":
            self._stream: Any = module.ZstdCompressor().compressobj()
            self._flush_block: Any = module.COMPRESSOBJ_FLUSH_BLOCK
        else:
            self._stream = module.ZstdCompressor()
            self._flush_block = module.ZstdCompressor.FLUSH_BLOCK

    def frame(self, text: str) -> bytes | str:
        data = text.encode()
        if self._module_name == "zstandard":
            return bytes(self._stream.compress(data) + self._stream.flush(self._flush_block))
        return bytes(self._stream.compress(data, mode=self._flush_block))


def _zstd_module() -> str | None:
    for name in ("compression.zstd", "zstandard"):
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return name
    return None


def make_compressor(requested: str | None, enabled: bool) -> _Compressor:
    if not enabled or not requested:
        return _Plain()
    if requested == "zlib-stream":
        return _ZlibStream()
    if requested == "zstd-stream":
        module = _zstd_module()
        if module is not None:
            return _ZstdStream(module)
    return _Plain()


@dataclass
class _Outgoing:
    text: str | None
    sent: asyncio.Future[bool] | None = None
    on_sent: Callable[[], None] | None = None
    close_code: int | None = None
    close_reason: str = ""


@dataclass(eq=False)
class GatewayConnection:
    """One websocket. ``compression`` is what the fake actually used (``none`` for text frames)."""

    id: int
    path: str
    compression: str
    requested_compression: str | None
    ws: web.WebSocketResponse = field(repr=False)
    session: GatewaySession | None = None
    heartbeats: int = 0
    last_heartbeat_seq: int | None = None
    server_close_code: int | None = None
    client_close_code: int | None = None
    open: bool = True
    deaf: bool = False
    """Half-open (``FakeDiscord.go_deaf``): the socket stays up, but heartbeats get no HEARTBEAT_ACK and every
    frame Discord sends on it (dispatches, ops) is lost on the way. A session's events still count and are
    logged, so a RESUME elsewhere replays them."""
    heartbeats_unanswered: int = 0
    frames_lost: int = 0
    _queue: asyncio.Queue[_Outgoing] = field(default_factory=asyncio.Queue, repr=False)
    _compressor: _Compressor = field(default_factory=_Plain, repr=False)

    def enqueue(self, item: _Outgoing) -> None:
        if self.open:
            self._queue.put_nowait(item)
        elif item.sent is not None and not item.sent.done():
            item.sent.set_result(False)


@dataclass(eq=False)
class GatewaySession:
    """A gateway session (one IDENTIFY). ``events`` lists the dispatched event names in sequence order."""

    session_id: str
    intents: int
    shard: tuple[int, int] | None
    identify: JsonDict
    identified_at: float
    seq: int = 0
    state: SessionState = "connected"
    resumes: int = 0
    detached_at: float | None = None
    events: list[str] = field(default_factory=list)
    connection: GatewayConnection | None = field(default=None, repr=False)
    _log: list[tuple[int, str]] = field(default_factory=list, repr=False)

    def has_intent(self, intent: int) -> bool:
        return (self.intents & intent) == intent

    @property
    def message_content_requested(self) -> bool:
        return self.has_intent(GatewayIntent.MESSAGE_CONTENT)

    @property
    def connected(self) -> bool:
        return self.state == "connected"

    def handles_guild(self, guild_id: int | None) -> bool:
        if self.shard is None:
            return True
        shard_id, shard_count = self.shard
        if guild_id is None:
            return shard_id == 0
        return (guild_id >> 22) % shard_count == shard_id


class FakeGateway:
    """Serves the websocket and fans events out to sessions. Implements the state's ``EventSink``."""

    def __init__(
        self,
        world: World,
        *,
        heartbeat_interval: float,
        compression: bool,
        resume_timeout: float,
        reject_ungranted_privileged_intents: bool,
        granted_privileged_intents: Callable[[], int],
        notify: Callable[[], None],
    ) -> None:
        self.world = world
        self.heartbeat_interval = heartbeat_interval
        self.compression = compression
        self.resume_timeout = resume_timeout
        self.reject_ungranted_privileged_intents = reject_ungranted_privileged_intents
        self.granted_privileged_intents = granted_privileged_intents
        self.ack_heartbeats = True
        self.sessions: list[GatewaySession] = []
        self.connections: list[GatewayConnection] = []
        self.gateway_url = ""
        self.resume_gateway_url = ""
        self._notify = notify
        self._writers: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.Event()
        self._accepting.set()

    def hold_new_connections(self) -> None:
        self._accepting.clear()

    def release_new_connections(self) -> None:
        self._accepting.set()

    # --- fan-out --------------------------------------------------------------------------------------------

    def _live_sessions(self) -> list[GatewaySession]:
        now = self.world.clock.now()
        live: list[GatewaySession] = []
        for session in self.sessions:
            expired = session.detached_at is not None and now - session.detached_at > self.resume_timeout
            if session.state == "detached" and expired:
                session.state = "invalidated"
            if session.state != "invalidated":
                live.append(session)
        return live

    def dispatch(
        self,
        event: str,
        build: EventBuilder,
        *,
        intents: int,
        guild_id: int | None,
        on_sent: Callable[[], None] | None = None,
    ) -> list[asyncio.Future[bool]]:
        """Send an event to every live session that has ``intents`` and handles ``guild_id``'s shard.

        Detached sessions log it for a later RESUME. Returns one future per connected session, resolved
        (True) once the frame was written to the socket; ``on_sent`` runs at that moment.
        """
        futures: list[asyncio.Future[bool]] = []
        for session in self._live_sessions():
            if intents and not session.has_intent(intents):
                continue
            if not session.handles_guild(guild_id):
                continue
            future = self._send_event(session, event, build(session.intents), on_sent)
            if future is not None:
                futures.append(future)
        return futures

    async def flush(self) -> None:
        """Wait until every frame queued so far on every open connection has been written."""
        markers: list[asyncio.Future[bool]] = []
        loop = asyncio.get_running_loop()
        for conn in self.connections:
            if conn.open:
                marker: asyncio.Future[bool] = loop.create_future()
                conn.enqueue(_Outgoing(text=None, sent=marker))
                markers.append(marker)
        if markers:
            await asyncio.wait(markers, timeout=5.0)

    def _send_event(
        self, session: GatewaySession, event: str, data: JsonDict, on_sent: Callable[[], None] | None = None
    ) -> asyncio.Future[bool] | None:
        session.seq += 1
        text = json.dumps({"op": 0, "t": event, "s": session.seq, "d": data}, separators=(",", ":"))
        session._log.append((session.seq, text))
        session.events.append(event)
        conn = session.connection
        if session.state != "connected" or conn is None or not conn.open:
            return None
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        conn.enqueue(_Outgoing(text=text, sent=future, on_sent=on_sent))
        return future

    # --- control (used by the test API) ---------------------------------------------------------------------

    def _send_op(self, conn: GatewayConnection, op: int, data: Any) -> None:
        conn.enqueue(_Outgoing(text=json.dumps({"op": op, "d": data}, separators=(",", ":"))))

    def close(self, conn: GatewayConnection, code: int, reason: str = "") -> None:
        conn.enqueue(_Outgoing(text=None, close_code=code, close_reason=reason))

    def request_reconnect(self) -> int:
        """Send op 7 RECONNECT on every identified connection; returns how many got it."""
        count = 0
        for conn in self.connections:
            if conn.open and conn.session is not None:
                self._send_op(conn, 7, None)
                count += 1
        return count

    def invalidate_sessions(self, *, resumable: bool) -> int:
        count = 0
        for conn in self.connections:
            if conn.open and conn.session is not None:
                if not resumable:
                    conn.session.state = "invalidated"
                self._send_op(conn, 9, resumable)
                count += 1
        return count

    def drop_connections(self, code: int) -> int:
        count = 0
        for conn in self.connections:
            if conn.open:
                self.close(conn, code, "closed by the fake")
                count += 1
        return count

    async def shutdown(self) -> None:
        for conn in self.connections:
            if conn.open:
                self.close(conn, 1001, "fake Discord stopping")
        writers = list(self._writers)
        if writers:
            _done, pending = await asyncio.wait(writers, timeout=2.0)
            for task in pending:
                task.cancel()

    # --- websocket handler ----------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=0, timeout=2.0)
        await ws.prepare(request)
        requested = request.query.get("compress")
        compressor = make_compressor(requested, self.compression)
        conn = GatewayConnection(
            id=len(self.connections) + 1,
            path=request.path,
            compression=compressor.mode,
            requested_compression=requested,
            ws=ws,
        )
        conn._compressor = compressor
        self.connections.append(conn)
        writer = asyncio.create_task(self._write_loop(conn), name=f"fake-discord-gateway-writer-{conn.id}")
        self._writers.add(writer)
        writer.add_done_callback(self._writers.discard)
        self._notify()
        if not self._accepting.is_set():
            # The socket is open but HELLO is withheld until the test releases it.
            await self._accepting.wait()

        if request.query.get("encoding", "json") != "json":
            self.close(conn, DECODE_ERROR, "only encoding=json is supported by the fake")
        elif request.query.get("v") not in (None, "9", "10"):
            self.close(conn, INVALID_API_VERSION, "Invalid API version")
        else:
            self._send_op(conn, 10, {"heartbeat_interval": int(self.heartbeat_interval * 1000)})

        try:
            async for msg in ws:
                if msg.type is WSMsgType.TEXT:
                    self._on_frame(conn, msg.data)
                elif msg.type is WSMsgType.BINARY:
                    self._on_frame(conn, msg.data.decode("utf-8", "replace"))
                elif msg.type is WSMsgType.ERROR:
                    break
        finally:
            conn.open = False
            conn.client_close_code = ws.close_code
            self._on_disconnect(conn)
            conn._queue.put_nowait(_Outgoing(text=None, close_code=-1))  # stops the writer
            self._notify()
        return ws

    async def _write_loop(self, conn: GatewayConnection) -> None:
        ws = conn.ws
        while True:
            item = await conn._queue.get()
            if item.close_code is not None:
                if item.close_code >= 0 and not ws.closed:
                    conn.server_close_code = item.close_code
                    with contextlib.suppress(Exception):
                        await ws.close(code=item.close_code, message=item.close_reason.encode())
                self._drain_unsent(conn)
                return
            if item.text is None:  # a flush marker
                if item.sent is not None and not item.sent.done():
                    item.sent.set_result(True)
                continue
            if conn.deaf:  # Discord wrote it; it never reaches the client
                conn.frames_lost += 1
                if item.on_sent is not None:
                    item.on_sent()
                if item.sent is not None and not item.sent.done():
                    item.sent.set_result(True)
                continue
            ok = False
            if not ws.closed:
                frame = conn._compressor.frame(item.text)
                try:
                    if isinstance(frame, bytes):
                        await ws.send_bytes(frame)
                    else:
                        await ws.send_str(frame)
                    ok = True
                except (ConnectionError, RuntimeError) as exc:
                    _log.debug("fake gateway: send failed on connection %s: %s", conn.id, exc)
            if ok and item.on_sent is not None:
                item.on_sent()
            if item.sent is not None and not item.sent.done():
                item.sent.set_result(ok)

    @staticmethod
    def _drain_unsent(conn: GatewayConnection) -> None:
        while not conn._queue.empty():
            item = conn._queue.get_nowait()
            if item.sent is not None and not item.sent.done():
                item.sent.set_result(False)

    def _on_disconnect(self, conn: GatewayConnection) -> None:
        session = conn.session
        if session is None or session.connection is not conn:
            return
        session.connection = None
        code = conn.server_close_code if conn.server_close_code is not None else conn.client_close_code
        if session.state == "connected":
            if code in _SESSION_ENDING_CLOSE_CODES:
                session.state = "invalidated"
            else:
                session.state = "detached"
                session.detached_at = self.world.clock.now()

    # --- client frames --------------------------------------------------------------------------------------

    def _on_frame(self, conn: GatewayConnection, text: str) -> None:
        try:
            payload = json.loads(text)
            op = int(payload["op"])
        except (ValueError, KeyError, TypeError):
            self.close(conn, DECODE_ERROR, "Error while decoding payload.")
            return
        data = payload.get("d")
        if op == 1:
            conn.heartbeats += 1
            conn.last_heartbeat_seq = data if isinstance(data, int) else None
            if conn.deaf:
                conn.heartbeats_unanswered += 1
            elif self.ack_heartbeats:
                self._send_op(conn, 11, None)
            self._notify()
        elif op == 2:
            self._identify(conn, data if isinstance(data, dict) else {})
        elif op == 6:
            self._resume(conn, data if isinstance(data, dict) else {})
        elif conn.session is None:
            self.close(conn, NOT_AUTHENTICATED, "Not authenticated.")
        elif op == 8:
            self._request_members(conn.session, data if isinstance(data, dict) else {})
        elif op in (3, 4):
            pass  # presence / voice state updates are accepted and ignored
        else:
            self.close(conn, UNKNOWN_OPCODE, "Unknown opcode.")

    def _identify(self, conn: GatewayConnection, data: JsonDict) -> None:
        if conn.session is not None:
            self.close(conn, ALREADY_AUTHENTICATED, "Already authenticated.")
            return
        if data.get("token") != self.world.token:
            self.close(conn, AUTHENTICATION_FAILED, "Authentication failed.")
            return
        intents = data.get("intents")
        if not isinstance(intents, int) or intents < 0 or intents & ~ALL_INTENT_BITS:
            self.close(conn, INVALID_INTENTS, "Invalid intent(s).")
            return
        ungranted = intents & PRIVILEGED_INTENTS & ~self.granted_privileged_intents()
        if ungranted and self.reject_ungranted_privileged_intents:
            self.close(conn, DISALLOWED_INTENTS, "Disallowed intent(s).")
            return
        shard: tuple[int, int] | None = None
        raw_shard = data.get("shard")
        if raw_shard is not None:
            if (
                not isinstance(raw_shard, list)
                or len(raw_shard) != 2
                or not all(isinstance(x, int) for x in raw_shard)
                or not 0 <= raw_shard[0] < raw_shard[1]
            ):
                self.close(conn, INVALID_SHARD, "Invalid shard.")
                return
            shard = (raw_shard[0], raw_shard[1])
        session = GatewaySession(
            session_id=secrets.token_hex(16),
            intents=intents,
            shard=shard,
            identify={k: v for k, v in data.items() if k != "token"},
            identified_at=self.world.clock.now(),
        )
        session.connection = conn
        conn.session = session
        self.sessions.append(session)
        world = self.world
        guilds = [g for g in world.guilds.values() if session.handles_guild(g.id)]
        ready: JsonDict = {
            "v": 10,
            "user": {
                **world.bot.payload(),
                "verified": True,
                "mfa_enabled": False,
                "flags": 0,
                "email": None,
            },
            "guilds": [{"id": str(g.id), "unavailable": True} for g in guilds],
            "session_id": session.session_id,
            "session_type": "normal",
            "resume_gateway_url": self.resume_gateway_url,
            "application": {"id": str(world.application_id), "flags": world.application_payload()["flags"]},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "user_settings": {},
            "geo_ordered_rtc_regions": [],
            "auth": {},
        }
        if shard is not None:
            ready["shard"] = list(shard)
        self._send_event(session, "READY", ready)
        for guild in guilds:
            self._send_event(session, "GUILD_CREATE", world.guild_create_payload(guild, intents))
        self._notify()

    def _resume(self, conn: GatewayConnection, data: JsonDict) -> None:
        if conn.session is not None:
            self.close(conn, ALREADY_AUTHENTICATED, "Already authenticated.")
            return
        if data.get("token") != self.world.token:
            self.close(conn, AUTHENTICATION_FAILED, "Authentication failed.")
            return
        session_id = data.get("session_id")
        seq = data.get("seq")
        session = next(
            (s for s in self._live_sessions() if s.session_id == session_id),
            None,
        )
        if session is None or not isinstance(seq, int) or seq > session.seq:
            self._send_op(conn, 9, False)
            self._notify()
            return
        previous = session.connection
        if previous is not None and previous.open:
            previous.session = None
            self.close(previous, UNKNOWN_ERROR, "Session resumed elsewhere.")
        session.connection = conn
        session.state = "connected"
        session.detached_at = None
        session.resumes += 1
        conn.session = session
        for logged_seq, text in session._log:
            if logged_seq > seq:
                conn.enqueue(_Outgoing(text=text))
        self._send_event(session, "RESUMED", {})
        self._notify()

    def _request_members(self, session: GatewaySession, data: JsonDict) -> None:
        try:
            guild = self.world.guilds[int(data["guild_id"])]
        except (KeyError, TypeError, ValueError):
            return
        query = data.get("query")
        user_ids = [int(u) for u in data.get("user_ids") or []]
        limit = int(data.get("limit") or 0)
        if user_ids:
            members = [guild.members[u] for u in user_ids if u in guild.members]
        else:
            prefix = (query or "").lower()
            members = [
                m
                for m in guild.members.values()
                if m.user.username.lower().startswith(prefix) or (m.nick or "").lower().startswith(prefix)
            ]
            if limit:
                members = members[:limit]
        chunk: JsonDict = {
            "guild_id": str(guild.id),
            "members": [m.payload() for m in members],
            "chunk_index": 0,
            "chunk_count": 1,
        }
        if user_ids:
            chunk["not_found"] = [str(u) for u in user_ids if u not in guild.members]
        if data.get("nonce") is not None:
            chunk["nonce"] = data["nonce"]
        self._send_event(session, "GUILD_MEMBERS_CHUNK", chunk)
