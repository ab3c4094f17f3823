"""The ops bot in-process: its tools, and the faux:demo script end to end through the bridge on an in-memory
platform (`MemoryTransport`), over the same runtime `python -m bots run` builds (real SQLite file)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from adapters.bridge import ApprovalDoc, IncomingMessage, Place
from adapters.bridge.testing import MemoryTransport
from adapters.redact import install_log_redaction
from bots.config import BotConfig, parse_config
from bots.ops import ops_extension, search_log_files, ticket_key, tracker_open
from bots.runtime import Runtime, open_runtime, sync_agents
from harness_core import AgentDoc

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "config" / "sample-logs"
PLACE = Place("memory", "T1", "C1")
WEBHOOK = "https://deploy.test/hooks/deploy"


def config_for(tmp_path: Path, extra: str = "", *, instructions: str = "be brief") -> BotConfig:
    text = f"""
[bot]
model = "faux:demo"
instructions = "{instructions}"
[storage]
path = "{tmp_path / "bot.sqlite"}"
[answer]
mode = "mentions"
[approvals]
approvers = ["U-lead", "U-ops"]
[logs]
path = "{LOGS}"
[tickets]
path = "{tmp_path / "tickets.json"}"
{extra}
"""
    return parse_config(text, tmp_path / "bot.toml")


@dataclass
class Bot:
    runtime: Runtime
    platform: MemoryTransport

    async def say(
        self, message_id: str, text: str, *, user: str = "U-alice", name: str = "alice", mention: bool = True
    ) -> Any:
        return await self.runtime.bridge.intake(
            IncomingMessage(PLACE, message_id, user, name, text, mentions_bot=mention)
        )

    async def settle(self) -> None:
        await self.runtime.harness.wait_for_idle()
        delivery = self.runtime.bridge.delivery
        while delivery.workers:
            await delivery.idle()
            await asyncio.sleep(0)

    def answers(self) -> list[str]:
        return [m.text for m in self.platform.in_place(PLACE) if m.gate is None]

    async def answers_when(self, count: int) -> list[str]:
        """The answers once there are `count` (a gate's outcome is reported in a turn of its own, started by
        the gate's background task, so an idle harness does not mean it was reported yet)."""
        for _ in range(1000):
            await self.settle()
            if len(self.answers()) >= count:
                await self.settle()
                return self.answers()
            await asyncio.sleep(0.01)
        raise AssertionError(f"fewer than {count} answers: {self.answers()}")

    async def next_gate(self) -> tuple[int, dict[str, Any]]:
        """Wait (on commits, not a timer) until an approval request is pending and its gate task waits for
        the decision, which is when a human can see the buttons."""
        harness = self.runtime.harness
        changed = asyncio.Event()
        dispose = harness.add_publication_listener(lambda _publication: changed.set())
        try:
            while True:
                changed.clear()
                for key, gate in (await harness.family(ApprovalDoc)).items():
                    task = await harness.get_task(int(gate.get("task_id") or 0))
                    if (
                        gate.get("status") == "pending"
                        and task is not None
                        and task.state.status == "waiting"
                    ):
                        return int(key), gate
                await asyncio.wait_for(changed.wait(), 10)
        finally:
            dispose()


@pytest.fixture
async def start_bot() -> AsyncIterator[Callable[[BotConfig], Awaitable[Bot]]]:
    started: list[Runtime] = []

    async def start(config: BotConfig, env: dict[str, str] | None = None) -> Bot:
        runtime = await open_runtime(config, {"DURABLE_BOTS_DEMO_DELAY_MS": "0", **(env or {})})
        started.append(runtime)
        platform = MemoryTransport("memory")
        runtime.bridge.attach(platform)
        await runtime.bridge.start()
        runtime.harness.resume()
        return Bot(runtime, platform)

    yield start
    for runtime in started:
        await runtime.close()


# --- tools ----------------------------------------------------------------------------------------------


async def test_replay_policies_of_the_ops_tools(tmp_path: Path, start_bot: Any) -> None:
    bot = await start_bot(config_for(tmp_path))
    tools = {t.name: t.replay for t in ops_extension(bot.runtime.ops).tools}
    assert tools == {
        "search_logs": "safe",
        "open_ticket": "safe",
        "deploy": "unsafe",
        "search_history": "safe",
    }


def test_search_logs_reads_the_configured_logs() -> None:
    found = search_log_files(LOGS, "NullPointerException", 50)
    assert not found.is_error and isinstance(found.content, str)
    assert found.content.startswith("5 match(es) for /NullPointerException/ in 4 log file(s):")
    assert (
        "checkout.log:4: 2025-11-29T02:58:11Z checkout ERROR OrderService: NullPointerException"
        in found.content
    )
    limited = search_log_files(LOGS, "error", 2)
    assert "(showing the first 2)" in str(limited.content) and len(str(limited.content).splitlines()) == 3
    literal = search_log_files(LOGS, "statement timeout (", 50)  # not a valid regex: searched literally
    assert str(literal.content).startswith("No matches")
    one_file = search_log_files(LOGS / "payments.log", "ledger", 50)
    assert "payments.log:3:" in str(one_file.content)
    assert search_log_files(LOGS / "missing", "x", 50).is_error


def test_tool_errors_name_the_config_key_and_leave_the_path_to_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "srv" / "secret-layout" / "logs"
    result = search_log_files(missing, "x", 50)
    assert result.is_error and "logs.path" in str(result.content)
    assert str(tmp_path) not in str(result.content) and "secret-layout" not in str(result.content)
    assert str(missing) in caplog.text  # the operator still learns which path


async def test_a_tool_that_cannot_write_its_file_says_which_setting_not_which_path(
    tmp_path: Path, start_bot: Any, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    config = config_for(tmp_path, f'[deploy]\nrecord_path = "{blocked / "deploys.jsonl"}"\n')
    bot = await start_bot(config)
    await bot.say("100.1", "deploy checkout 1.4.3")
    gate_id, _ = await bot.next_gate()
    await bot.runtime.bridge.decide(gate_id, user_id="U-lead", user_name="lead", action="approve")
    await bot.settle()
    answers = "\n".join(bot.answers())
    assert "Could not write the local deploy record (deploy.record_path)" in answers
    assert str(tmp_path) not in answers
    assert str(blocked / "deploys.jsonl") in caplog.text


def test_open_ticket_is_keyed_by_its_normalized_title(tmp_path: Path) -> None:
    path = tmp_path / "tickets.json"
    first, created = tracker_open(path, "NPE in OrderService", "body", ticket_key("NPE in OrderService"), {})
    again, created_again = tracker_open(
        path, "npe  in orderservice", "", ticket_key(" npe  in orderservice "), {}
    )
    other, _ = tracker_open(path, "Disk full on search", "", ticket_key("Disk full on search"), {})
    assert (created, created_again) == (True, False)
    assert first["id"] == again["id"] == "TICKET-1" and other["id"] == "TICKET-2"
    assert [t["key"] for t in json.loads(path.read_text())] == [
        "ticket:npe in orderservice",
        "ticket:disk full on search",
    ]


# --- the faux:demo flow through the bridge ---------------------------------------------------------------


async def test_demo_incident_suggests_a_deploy_and_only_an_explicit_request_asks_for_one(
    tmp_path: Path, start_bot: Any
) -> None:
    bot = await start_bot(config_for(tmp_path, f'[deploy]\nwebhook_url = "{WEBHOOK}"\n'))
    with respx.mock(assert_all_called=False) as mock:
        hook = mock.post(WEBHOOK).respond(202, json={"deployment": "dep-77"})
        await bot.say("100.1", "<@bot> checkout is throwing errors")
        await bot.settle()
        (suggestion,) = bot.answers()
        assert suggestion.startswith(
            "The logs show 5 error(s) from checkout; the most frequent (4x) is: OrderService"
        )
        assert "say `deploy checkout 1.4.3`" in suggestion
        assert await bot.runtime.harness.family(ApprovalDoc) == {}, "a log search never asks for a deploy"
        for number, chat in enumerate(("are you there?", "we got an alert from checkout again", "ok thanks")):
            await bot.say(f"200.{number}", chat)
        await bot.settle()
        assert await bot.runtime.harness.family(ApprovalDoc) == {}, "ordinary chat never asks for a deploy"

        await bot.say("100.9", "deploy checkout 1.4.3")
        gate_id, gate = await bot.next_gate()
        assert gate["tool"] == "deploy" and gate["arguments"] == {"service": "checkout", "version": "1.4.3"}
        assert gate["requester"] == {"user_id": "U-alice", "user_name": "alice"}
        assert not hook.called, "nothing is deployed before an approver decides"
        waiting = (await bot.answers_when(5))[-1]
        # The explanation streamed before the gated call stays visible above the answer.
        assert waiting.startswith(
            "Requesting a deploy of checkout 1.4.3; it runs only after an approver clicks Approve.\n\n"
            "I asked to deploy checkout 1.4.3; it waits for an approver"
        )
        assert f"request #{gate_id}; may approve: U-lead" in waiting

        refused = await bot.runtime.bridge.decide(
            gate_id, user_id="U-alice", user_name="alice", action="approve"
        )
        assert (refused.accepted, refused.reason) == (False, "not_an_approver")
        decided = await bot.runtime.bridge.decide(
            gate_id, user_id="U-lead", user_name="lead", action="approve"
        )
        assert decided.accepted and decided.status == "approved"
        report = (await bot.answers_when(6))[-1]

    assert hook.call_count == 1
    request = hook.calls.last.request
    assert request.headers["Idempotency-Key"] == f"deploy-{gate_id}"
    payload = json.loads(request.content)
    assert payload["service"] == "checkout" and payload["version"] == "1.4.3"
    assert (payload["requested_by"], payload["approved_by"]) == ("alice", "lead")
    assert report.startswith(f"Done: the deploy of checkout 1.4.3 (request #{gate_id}) was approved by lead")
    assert "HTTP 202" in report and f"idempotency key deploy-{gate_id}" in report
    (approval,) = [m for m in bot.platform.in_place(PLACE) if m.gate is not None]
    assert (
        approval.gate is not None
        and approval.gate.status == "approved"
        and approval.gate.decided_by == "lead"
    )


async def test_the_webhook_url_is_logged_without_its_credentials_or_query(
    tmp_path: Path, start_bot: Any, caplog: pytest.LogCaptureFixture
) -> None:
    install_log_redaction()  # what `python -m bots` does before anything logs
    caplog.set_level(logging.DEBUG)
    secret_url = "https://deployer:hunter2@deploy.test/hooks/deploy?token=s3cret"
    bot = await start_bot(config_for(tmp_path), {"DEPLOY_WEBHOOK_URL": secret_url})
    with respx.mock(assert_all_called=False) as mock:
        hook = mock.post(url__startswith="https://deploy.test/hooks/deploy").respond(202)
        await bot.say("100.1", "deploy checkout 1.4.3")
        gate_id, _ = await bot.next_gate()
        await bot.runtime.bridge.decide(gate_id, user_id="U-lead", user_name="lead", action="approve")
        await bot.settle()
    assert hook.call_count == 1
    assert "HTTP Request: POST https://***@deploy.test/hooks/deploy?token=***" in caplog.text  # httpx, INFO
    assert "hunter2" not in caplog.text and "s3cret" not in caplog.text
    assert all("s3cret" not in answer and "hunter2" not in answer for answer in bot.answers())


async def test_demo_deploy_denied_or_self_approved_runs_nothing(tmp_path: Path, start_bot: Any) -> None:
    bot = await start_bot(config_for(tmp_path, f'[deploy]\nwebhook_url = "{WEBHOOK}"\n'))
    with respx.mock(assert_all_called=False) as mock:
        hook = mock.post(WEBHOOK).respond(202)
        await bot.say("100.1", "deploy payments 2.8.0 please", user="U-ops", name="ops")
        gate_id, gate = await bot.next_gate()
        assert gate["arguments"] == {"service": "payments", "version": "2.8.0"}
        own = await bot.runtime.bridge.decide(gate_id, user_id="U-ops", user_name="ops", action="approve")
        assert (own.accepted, own.reason) == (False, "self_approval")
        await bot.runtime.bridge.decide(gate_id, user_id="U-lead", user_name="lead", action="deny")
        answer = (await bot.answers_when(2))[-1]
    assert not hook.called
    assert answer == (
        f"The deploy of payments 2.8.0 (request #{gate_id}) was denied by lead, so nothing was run."
    )


async def test_without_a_webhook_the_deploy_is_recorded_locally_and_says_so(
    tmp_path: Path, start_bot: Any
) -> None:
    bot = await start_bot(config_for(tmp_path))
    await bot.say("100.1", "deploy checkout 1.4.3")
    gate_id, _ = await bot.next_gate()
    await bot.runtime.bridge.decide(gate_id, user_id="U-lead", user_name="lead", action="approve")
    answer = (await bot.answers_when(2))[-1]
    (record,) = [json.loads(line) for line in (tmp_path / "deploys.jsonl").read_text().splitlines()]
    assert record["idempotency_key"] == f"deploy-{gate_id}" and record["approved_by"] == "lead"
    assert "No deploy webhook is configured (deploy.webhook_url), so nothing was deployed for real" in answer


async def test_webhook_refusal_is_an_error_result_the_model_reports(tmp_path: Path, start_bot: Any) -> None:
    bot = await start_bot(config_for(tmp_path, f'[deploy]\nwebhook_url = "{WEBHOOK}"\n'))
    with respx.mock(assert_all_called=False) as mock:
        mock.post(WEBHOOK).mock(side_effect=httpx.ConnectError("refused"))
        await bot.say("100.1", "deploy checkout 1.4.3")
        gate_id, _ = await bot.next_gate()
        await bot.runtime.bridge.decide(gate_id, user_id="U-lead", user_name="lead", action="approve")
        answer = (await bot.answers_when(2))[-1]
    assert answer == (
        f"The deploy of checkout 1.4.3 (request #{gate_id}) was approved by lead but failed: Could not reach "
        "the deploy webhook (ConnectError); nothing was deployed."
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("open a ticket for the slow search page", "Done: Opened TICKET-1: The slow search page."),
        (
            "payments is slow",
            "No fixed build is ready, so I opened a ticket: Opened TICKET-1: payments: ledger",
        ),
        ("remind me in 5 minutes to check the dashboards", "Scheduled in 5 minutes (at "),
        ('/call search_logs {"pattern": "no space left"}', "`search_logs` returned:\n1 match(es)"),
        ("hello there", "Hi alice! I am the ops bot running the offline demo model"),
    ],
)
async def test_demo_script_flows(tmp_path: Path, start_bot: Any, text: str, expected: str) -> None:
    bot = await start_bot(config_for(tmp_path))
    await bot.say("100.1", text)
    await bot.settle()
    (answer,) = bot.answers()
    assert expected in answer


async def test_search_history_asks_a_task_owned_subagent_about_earlier_messages(
    tmp_path: Path, start_bot: Any
) -> None:
    bot = await start_bot(config_for(tmp_path))
    await bot.say(
        "100.1", "heads up: the checkout deploy moved to 5pm", user="U-bob", name="bob", mention=False
    )
    await bot.say("100.2", "<@bot> what did we say about checkout earlier?")
    await bot.settle()
    (answer,) = bot.answers()
    assert answer.startswith(
        "Here is what the history search found:\nI found 1 earlier message(s) about checkout"
    )
    assert "bob: heads up: the checkout deploy moved to 5pm" in answer
    assert "what did we say" not in answer, "the question itself is not 'earlier'"
    storage = bot.runtime.storage
    conversations = (await storage.scan_conversations(limit=50)).items
    (child,) = [c for c in conversations if c.owner_task_id is not None]
    agent = await bot.runtime.harness.snapshot(AgentDoc, child.id)
    assert agent["tools"] == ["lookup_conversations"], "the subagent can only read"


async def test_a_changed_config_reaches_existing_conversations(tmp_path: Path, start_bot: Any) -> None:
    bot = await start_bot(config_for(tmp_path, instructions="v1"))
    await bot.say("100.1", "hello")
    await bot.settle()
    await bot.runtime.close()
    changed = config_for(tmp_path, instructions="v2")
    runtime = await open_runtime(changed, {})
    try:
        assert await sync_agents(runtime) == 1
        assert await sync_agents(runtime) == 0
        conversations = (await runtime.storage.scan_conversations(limit=10)).items
        agents = [await runtime.harness.snapshot(AgentDoc, c.id) for c in conversations]
        assert [a["instructions"] for a in agents] == ["v2"]
    finally:
        await runtime.close()
