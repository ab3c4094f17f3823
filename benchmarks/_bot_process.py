"""Real `durable-bots run` processes on PostgreSQL against the fake Slack, for `pg_capacity` and `workers`.

Each process gets its config file (the store's URL, Socket Mode or HTTP, an admin endpoint on its own loopback
port for `/metrics`, the `lookup` tool of `benchmarks._bench_tools`); its stdout is read all the time (a bot
under load must never block on a full pipe) and its stderr goes to a file in the scratch directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
import time
from pathlib import Path

import httpx

from benchmarks._env import REPO

READY = "durable-bots: ready"
CONFIG = """
[bot]
name = "bench-bot"
model = "faux:demo"

[storage]
url = {url}
lease_ttl = {ttl}
{partitions}
[workers]
intake = "{intake}"
{worker_nice}
[answer]
mode = "mentions"

[tools]
modules = ["benchmarks._bench_tools"]

[approvals]
tools = []

[tickets]
path = {tickets}

[deploy]
record_path = {deploys}

[admin]
listen = "127.0.0.1:{admin_port}"

[adapters.slack]
mode = "{mode}"
port = {http_port}
edit_interval = 0.05
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The end of `faux:demo`'s plain answer (its help text), which it gives to a mention it has no script for.
LAST_LINE = "without running a tool twice."


def lookup_text(key: str) -> str:
    """What a user posts to run one scripted turn on `faux:demo`: the tool call, its result, the answer.

    Only when the mention is alone in its turn: recorded messages that came before it in the channel are folded
    into the same user message, and the demo then reads the first of them and gives its plain answer."""
    return f'/call lookup {{"key": "{key}"}}'


def answered_key(text: str) -> str | None:
    """The key of a final answer to `lookup_text(key)` (the demo answers "`lookup` returned:\\n<key> = 42")."""
    _, sep, rest = text.partition("`lookup` returned:")
    if not sep:
        return None
    key, sep, _ = rest.strip().partition(" = ")
    return key if sep else None


class BotProcess:
    """One `python -m bots run --adapter slack` process."""

    def __init__(
        self,
        name: str,
        scratch: Path,
        url: str,
        *,
        mode: str = "socket",
        partitions: int | None = None,
        intake: str = "shared",
        worker_nice: int | None = None,
        lease_ttl: float = 10.0,
    ) -> None:
        self.name = name
        self.admin_port = free_port()
        self.http_port = free_port() if mode == "http" else 0
        self.config = scratch / f"{name}.toml"
        self.stderr_path = scratch / f"{name}.stderr"
        self.lines: list[str] = []
        self._changed = asyncio.Event()
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self.config.write_text(
            CONFIG.format(
                url=json.dumps(url),
                ttl=lease_ttl,
                partitions="" if partitions is None else f"partitions = {partitions}\n",
                tickets=json.dumps(str(scratch / "tickets.json")),
                deploys=json.dumps(str(scratch / "deploys.jsonl")),
                admin_port=self.admin_port,
                mode=mode,
                http_port=self.http_port,
                intake=intake,
                worker_nice="" if worker_nice is None else f"worker_nice = {worker_nice}\n",
            )
        )

    @property
    def events_url(self) -> str:
        """The HTTP Events API Request URL of this process (HTTP mode)."""
        return f"http://127.0.0.1:{self.http_port}/slack/events"

    async def start(self, env: dict[str, str]) -> None:
        # A session of its own, as a separately launched service (a systemd unit, a container) is: where the
        # kernel shares CPU time out by session (autogroup), the bots and this process (the fake Slack, which
        # stands in for Slack's own servers) then get a share each instead of one share among all of them.
        with self.stderr_path.open("ab") as stderr:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bots",
                "run",
                "--config",
                str(self.config),
                "--adapter",
                "slack",
                cwd=REPO,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        while raw := await self._process.stdout.readline():
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
            self._changed.set()
        self._changed.set()

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    async def wait_for(self, prefix: str, timeout: float) -> str:
        """The first stdout line starting with `prefix` (already printed or still to come)."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            if self._process is None or self._process.returncode is not None:
                raise RuntimeError(
                    f"{self.name} ended before {prefix!r}: {self.lines[-20:]}\n{self.stderr()}"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no {prefix!r} in {timeout:g} s: {self.lines[-20:]}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    async def metrics(self) -> dict[str, float]:
        """The process's `/metrics`, each sample summed over its labels (`name` -> value)."""
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"http://127.0.0.1:{self.admin_port}/metrics")
        response.raise_for_status()
        return parse_metrics(response.text)

    async def stop(self, timeout: float = 30) -> None:
        """SIGTERM (a graceful stop), then SIGKILL if it does not end in time."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._reader is not None:
            await self._reader


def parse_metrics(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0]
        try:
            found[name] = found.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return found
