"""The admin server in process: a stuck event loop gets 503 (not a hung probe), the token rule, /readyz."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bots.admin import AdminError, AdminServer, readiness_of
from bots.config import ConfigError, Problem, parse_config
from bots.metrics import BotMetrics
from harness_core import Harness
from harness_core.storage import MemoryStorage


def fetch(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_a_stuck_event_loop_answers_503_and_readyz_names_what_is_not_ready() -> None:
    problems: dict[str, str] = {"slack": "not connected to slack"}

    async def readiness() -> dict[str, str]:
        return dict(problems)

    admin = AdminServer(("127.0.0.1", 0), BotMetrics(), readiness, {})
    await admin.start()
    try:
        status, text = await asyncio.to_thread(fetch, admin.url + "readyz")
        assert (status, json.loads(text)) == (503, {"ready": False, "not_ready": problems})
        problems.clear()
        assert (await asyncio.to_thread(fetch, admin.url + "readyz"))[0] == 200
        assert (await asyncio.to_thread(fetch, admin.url + "healthz"))[0] == 200
        # Block the loop for longer than the probe waits; the probe, served from its own thread, says so.
        probe = asyncio.get_running_loop().run_in_executor(None, fetch, admin.url + "healthz")
        time.sleep(1.6)  # noqa: ASYNC251 - the point: the event loop does not answer meanwhile
        status, text = await probe
        assert status == 503 and "did not answer" in json.loads(text)["error"]
        assert (await asyncio.to_thread(fetch, admin.url + "nowhere"))[0] == 404
    finally:
        await admin.stop()


async def test_a_token_is_required_off_loopback_and_checked_when_set() -> None:
    async def ready() -> dict[str, str]:
        return {}

    with pytest.raises(AdminError, match="ADMIN_TOKEN"):
        AdminServer(("0.0.0.0", 0), BotMetrics(), ready, {})
    admin = AdminServer(("127.0.0.1", 0), BotMetrics(), ready, {"ADMIN_TOKEN": "s3cret-admin"})
    await admin.start()
    try:
        assert (await asyncio.to_thread(fetch, admin.url + "metrics"))[0] == 401
        assert (await asyncio.to_thread(fetch, admin.url + "metrics", "wrong"))[0] == 401
        status, text = await asyncio.to_thread(fetch, admin.url + "metrics", "s3cret-admin")
        assert status == 200 and "durable_bots_parked_tasks" in text
    finally:
        await admin.stop()


async def test_readiness_names_the_phase_a_storage_that_cannot_serve_and_a_closed_harness() -> None:
    class LeasedStorage:
        reason: str | None = "lease not held (a standby)"

        def not_ready(self) -> str | None:
            return self.reason

    storage = LeasedStorage()
    harness = await Harness.open(MemoryStorage())
    phase = ["starting"]
    check = readiness_of(harness, [], phase, storage)
    assert await check() == {"bot": "starting", "storage": "lease not held (a standby)"}
    phase[0], storage.reason = "", None
    assert await check() == {}
    await harness.close()
    assert "storage" in await check()


@settings(max_examples=60, deadline=None)
@given(listen=st.text(max_size=24) | st.from_regex(r"\[?[0-9a-z.:]{1,12}\]?:[0-9]{1,6}", fullmatch=True))
def test_admin_listen_is_an_address_or_a_problem_naming_the_key(listen: str) -> None:
    text = f"[approvals]\ntools = []\n\n[admin]\nlisten = {json.dumps(listen)}\n"
    problems: list[Problem] = []
    try:
        config = parse_config(text, "bot.toml")
    except ConfigError as exc:
        problems = exc.problems
    if problems:
        assert all(p.key.startswith("admin.listen") or "TOML" in p.message for p in problems), problems
        return
    address = config.admin.address
    assert address is not None and 0 <= address[1] <= 65535 and address[0]
