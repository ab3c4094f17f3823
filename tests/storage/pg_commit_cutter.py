"""A TCP proxy in front of the test cluster that makes a commit's outcome unknown to the client while the commit
lands: armed, it passes the next commit to the server, drops the server's answer and then cuts the client's
connection (a network failure at the worst moment). With `hold`, it first keeps the commit that long (the
client gives up meanwhile) and passes it on afterwards: the commit lands after the client stopped waiting.

A commit is one statement (`_postgres_commit`); "the commit" is the Execute of that prepared statement."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

EXECUTE = b"E\x00\x00\x00\x09\x00"  # Execute, unnamed portal (asyncpg's; the row limit follows)
ONE_STATEMENT = b"WITH fence AS"  # the text of `_postgres_commit.COMMIT_ONE`, sent when it is prepared


class CommitCutter:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._url = parts
        self._server_host = parts.hostname or "127.0.0.1"
        self._server_port = parts.port or 5432
        self._listener: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.armed = False
        self.hold = 0.0  # seconds to keep the COMMIT before passing it on
        self.holding = asyncio.Event()  # set while a COMMIT is held
        self.cut = 0  # connections cut so far

    async def start(self) -> str:
        """Listen; returns the URL that goes through the proxy."""
        self._listener = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._listener.sockets[0].getsockname()[1]
        netloc = self._url.netloc.rpartition(":")[0] + f":{port}"
        return urlunsplit((self._url.scheme, netloc, self._url.path, self._url.query, ""))

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self._server_host, self._server_port)
        cutting = asyncio.Event()
        pumps = [
            asyncio.create_task(self._upstream(client_r, server_w, client_w, cutting)),
            asyncio.create_task(self._downstream(server_r, client_w, cutting)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
                self._tasks.discard(pump)
            client_w.transport.abort()
            server_w.transport.abort()

    async def _upstream(
        self,
        client_r: asyncio.StreamReader,
        server_w: asyncio.StreamWriter,
        client_w: asyncio.StreamWriter,
        cutting: asyncio.Event,
    ) -> None:
        commit_statement: bytes | None = None  # asyncpg's name for the prepared commit on this connection
        while data := await client_r.read(65536):
            cut_here = False
            if (at := data.find(b"\x00" + ONE_STATEMENT)) > 0:
                commit_statement = data[data.rfind(b"__asyncpg_stmt_", 0, at) : at + 1]
            else:
                # Bind of the commit statement, then Execute (asyncpg prepares it, introspects types, runs it).
                runs_commit = commit_statement is not None and commit_statement in data
                cut_here = self.armed and runs_commit and EXECUTE in data
            if cut_here:
                self.armed = False
                cutting.set()  # from now on nothing reaches the client
                if self.hold:
                    self.holding.set()
                    await asyncio.sleep(self.hold)
                    self.holding.clear()
            server_w.write(data)
            await server_w.drain()
            if cut_here:
                await asyncio.sleep(0.5)  # the server commits meanwhile
                self.cut += 1
                client_w.transport.abort()
                return

    async def _downstream(
        self, server_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, cutting: asyncio.Event
    ) -> None:
        while data := await server_r.read(65536):
            if cutting.is_set():
                continue
            client_w.write(data)
            await client_w.drain()
