"""The CLI as an operator uses it: real `python -m bots` processes over one SQLite file, real SIGKILL/SIGTERM.

The bot runs on a fake chat adapter (`bots_fake_chat`, loaded through the config like any adapter) with the
faux:demo model; `/call <tool> {json}` messages make the demo call a tool by hand. `bots_crash_tools` (a
`[tools] modules` plugin) supplies tools that kill their own process at chosen moments.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import stat
from pathlib import Path

import pytest
from bots_cli_support import BotProcess, bot_env, cli, journal, ledger, write_config, write_inbox_config

from harness_core.storage import SqliteStorage

pytestmark = pytest.mark.slow


def call(tool: str, arguments: dict[str, object], message_id: str = "1") -> dict[str, str]:
    return {"id": message_id, "text": f"/call {tool} {json.dumps(arguments)}"}


async def run_until_killed(config: Path, env: dict[str, str]) -> None:
    bot = await BotProcess.start(config, env=env)
    code = await bot.finish()
    assert code == -9, (
        f"expected the tool to SIGKILL the bot, got {code}\n{bot.output()}\n{await bot.stderr()}"
    )


async def test_inspect_lists_a_parked_task_and_retry_runs_it(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path, messages=[call("fragile", {})], restart_limit=1)
    # The tool kills its process every time: once, and once more after the restart (1 restart allowed).
    await run_until_killed(config, env)
    await run_until_killed(config, env)
    assert ledger(tmp_path) == ["fragile", "fragile"]

    inspected = await cli(config, "inspect", env=env)
    assert inspected.returncode == 0, inspected.stderr
    parked_lines = [line for line in inspected.stdout.splitlines() if "PARKED" in line]
    assert len(parked_lines) == 1 and "core.tool fragile" in parked_lines[0], inspected.stdout
    tasks = json.loads((await cli(config, "tasks", "--json", env=env)).stdout)["tasks"]
    (task_id,) = [t["id"] for t in tasks if t["state"] == "parked"]
    assert f"durable-bots retry {task_id}" in parked_lines[0]
    assert [(t["tool"], t["restarts"]) for t in tasks if t["state"] == "parked"] == [("fragile", 2)]

    (tmp_path / "repaired").touch()  # the operator fixes the cause
    retried = await cli(config, "retry", str(task_id), env=env)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert f"task {task_id} (core.tool fragile) completed" in retried.stdout
    assert "result: worked this time" in retried.stdout
    assert ledger(tmp_path) == ["fragile", "fragile", "fragile"]

    after = json.loads((await cli(config, "inspect", "--json", env=env)).stdout)
    assert after["parked"] == [] and after["tasks"] == []

    # The transcript, as JSONL: the question, the call, the tool's result, the answer to it.
    (conversation,) = [c for c in after["conversations"] if c["place"]]
    exported = await cli(config, "export", str(conversation["id"]), env=env)
    assert exported.returncode == 0, exported.stderr
    entries = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [e["id"] for e in entries] == sorted(e["id"] for e in entries)
    kinds = [e["kind"] for e in entries if e["kind"] != "core.system"]
    assert kinds == ["core.user", "core.assistant", "core.tool-result", "core.assistant"]
    assert entries[0]["model"][0]["content"] == "alice: /call fragile {}"
    result = next(e for e in entries if e["kind"] == "core.tool-result")["model"][0]
    assert result["content"][0]["text"] == "worked this time" and not result["is_error"]

    out = tmp_path / "export" / "transcript.jsonl"
    to_file = await cli(config, "export", str(conversation["id"]), "--out", str(out), env=env)
    assert to_file.returncode == 0 and f"wrote {len(entries)} entries" in to_file.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == entries
    assert (
        stat.S_IMODE(out.stat().st_mode) == 0o600
    )  # private like every file the bot writes, whatever the umask


async def test_retry_of_an_unknown_task_and_export_of_an_unknown_conversation_fail_clearly(
    tmp_path: Path,
) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path)
    missing = await cli(config, "inspect", env=env)
    assert missing.returncode == 1 and "there is no storage at" in missing.stderr
    bot = await BotProcess.start(config, env=env)
    assert await bot.wait_for(lambda line: "durable-bots: ready" in line) is not None
    assert await bot.terminate() == 0
    retried = await cli(config, "retry", "999999", env=env)  # one at a time: each takes the owner lock
    assert retried.returncode == 1 and "there is no task 999999" in retried.stderr
    exported = await cli(config, "export", "999999", env=env)
    assert exported.returncode == 1 and "there is no conversation 999999" in exported.stderr


async def test_a_second_process_on_the_same_storage_exits_2_and_names_the_holder(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path)
    bot = await BotProcess.start(config, env=env)
    try:
        assert await bot.wait_for(lambda line: "durable-bots: ready" in line) is not None, await bot.stderr()
        storage = tmp_path / "bot.sqlite"
        holder = (
            f"another durable-bots process (pid {bot.pid}, host {socket.gethostname()}) is using {storage}"
        )
        # Only a second bot is refused; operator commands read a snapshot (tests/bots/test_bots_operations.py).
        second, inspected = await asyncio.gather(cli(config, "run", env=env), cli(config, "inspect", env=env))
        assert second.returncode == 2
        assert f"{holder}; stop it first" in second.stderr
        assert inspected.returncode == 0, inspected.stderr
        assert await bot.terminate() == 0
    finally:
        await bot.kill()


async def test_sigterm_mid_answer_stops_cleanly_and_the_restart_finishes_the_same_message(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, messages=[{"id": "1", "text": "hello"}])
    slow = bot_env(tmp_path, DURABLE_BOTS_DEMO_DELAY_MS="40")
    bot = await BotProcess.start(config, env=slow)
    try:
        # The help answer streams for a few seconds; stop the bot once part of it is on the "platform".
        partial = await bot.wait_for_fake(
            lambda r: r["op"] == "edit" and not r["final"] and len(r["text"]) > 10
        )
        assert await bot.terminate() == 0, await bot.stderr()
    finally:
        await bot.kill()
    assert "stopping (SIGTERM)" in bot.output() and "stopped cleanly" in bot.output()

    # Nothing is left running, and the graceful stop did not count as a crash.
    storage = await SqliteStorage.open(tmp_path / "bot.sqlite")
    try:
        live = (await storage.scan_tasks(live=True, limit=100)).items
    finally:
        await storage.close()
    assert live, "the interrupted answer must still be there to resume"
    assert all(t.state.status != "running" and t.restarts == 0 for t in live)

    bot = await BotProcess.start(config, env=bot_env(tmp_path))
    try:
        final = await bot.wait_for_fake(lambda r: r["op"] == "edit" and r["final"] and "kill me" in r["text"])
        assert await bot.terminate() == 0
    finally:
        await bot.kill()
    assert final["id"] == partial["id"], "the restarted bot finishes the message it had started"
    creates = [r for r in journal(tmp_path) if r["op"] == "create" and r["key"] == partial["key"]]
    assert len(creates) == 1, "no second post of the same answer"


async def test_open_ticket_replayed_after_a_crash_finds_its_ticket(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path, messages=[call("open_ticket", {"title": "NPE in OrderService"})])
    await run_until_killed(config, env)  # the ticket exists, the tool result was never committed
    assert len(json.loads((tmp_path / "tickets.json").read_text())) == 1

    bot = await BotProcess.start(config, env=env)
    try:
        answer = await bot.wait_for_fake(
            lambda r: "returned" in r.get("text", "") and "TICKET-1" in r["text"]
        )
        assert await bot.terminate() == 0
    finally:
        await bot.kill()
    assert ledger(tmp_path) == ["open_ticket NPE in OrderService"] * 2  # replayed (replay="safe") ...
    tickets = json.loads((tmp_path / "tickets.json").read_text())
    assert [t["id"] for t in tickets] == ["TICKET-1"]  # ... and the key kept it from creating a duplicate
    assert "TICKET-1 is already open" in answer["text"]


async def test_search_history_replayed_after_a_crash_reuses_its_child_conversation(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    messages = [
        {"id": "1", "text": "heads up: the checkout deploy is at 5pm", "name": "bob"},
        call("search_history", {"question": "when is the checkout deploy?"}, message_id="2"),
    ]
    config = write_config(tmp_path, messages=messages)
    await run_until_killed(config, env)  # killed inside the subagent's lookup tool
    bot = await BotProcess.start(config, env=env)
    try:
        answer = await bot.wait_for_fake(lambda r: "earlier message" in r.get("text", ""))
        assert await bot.terminate() == 0
    finally:
        await bot.kill()
    assert ledger(tmp_path) == ["lookup checkout deploy"] * 2
    assert "bob: heads up: the checkout deploy is at 5pm" in answer["text"]

    report = json.loads((await cli(config, "inspect", "--json", env=env)).stdout)
    children = [c for c in report["conversations"] if c["owner_task_id"] is not None]
    assert len(children) == 1, "the re-executed tool found its child instead of creating another"
    exported = await cli(config, "export", str(children[0]["id"]), env=env)
    questions = [e for e in map(json.loads, exported.stdout.splitlines()) if e["kind"] == "core.user"]
    assert len(questions) == 1, "the child was asked once (same request id on re-execution)"


async def test_approvals_lists_a_pending_deploy_request(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path, messages=[{"id": "1", "text": "deploy checkout 1.4.3"}])
    bot = await BotProcess.start(config, env=env)
    try:
        gate = await bot.wait_for_fake(lambda r: r["op"] == "approval")
        assert await bot.terminate() == 0
    finally:
        await bot.kill()
    listed = await cli(config, "approvals", env=env)
    assert listed.returncode == 0, listed.stderr
    pending = listed.stdout.split("decided (0):")[0]
    assert f"gate #{gate['gate']}" in pending and '{"service": "checkout", "version": "1.4.3"}' in pending
    assert "asked by alice" in pending and "approvers: U-lead" in pending
    inspected = await cli(config, "inspect", env=env)
    assert "pending approvals (1):" in inspected.stdout
    assert any("bridge.gate deploy" in line and "waiting" in line for line in inspected.stdout.splitlines())


async def test_a_deploy_waiting_for_approval_survives_sigkill_and_runs_once_when_approved(
    tmp_path: Path,
) -> None:
    env = bot_env(tmp_path)
    config, inbox = write_inbox_config(tmp_path, "1", "deploy payments 2.8.0")
    bot = await BotProcess.start(config, env=env)
    try:
        gate = await bot.wait_for_fake(lambda r: r["op"] == "approval")
    finally:
        await bot.kill()  # SIGKILL while the deploy waits for a human

    bot = await BotProcess.start(config, env=env)
    try:
        assert await bot.wait_for(lambda line: "durable-bots: ready" in line) is not None
        inbox.write_text(
            json.dumps({"click": gate["gate"], "user": "U-lead", "name": "lead", "approve": True}) + "\n"
        )
        decision = await bot.wait_for_fake(lambda r: r["op"] == "decision")
        assert decision["accepted"] and decision["status"] == "approved"
        answer = await bot.wait_for_fake(
            lambda r: "the deploy of payments 2.8.0 (request #" in r.get("text", "") and "ran." in r["text"]
        )
        assert await bot.terminate() == 0
    finally:
        await bot.kill()
    (deploy,) = [json.loads(line) for line in (tmp_path / "deploys.jsonl").read_text().splitlines()]
    assert deploy["idempotency_key"] == f"deploy-{gate['gate']}" and deploy["approved_by"] == "lead"
    assert f"deploy-{gate['gate']}" in answer["text"]
    approvals = [r for r in journal(tmp_path) if r["op"] == "approval"]
    assert len(approvals) == 1, "the approval request was not posted again after the restart"


async def test_sigint_mid_answer_stops_run_cleanly_like_sigterm(tmp_path: Path) -> None:
    """Ctrl-C is the README's way to stop the bot: the same graceful path as SIGTERM, exit code 0."""
    config = write_config(tmp_path, messages=[{"id": "1", "text": "hello"}])
    bot = await BotProcess.start(config, env=bot_env(tmp_path, DURABLE_BOTS_DEMO_DELAY_MS="40"))
    try:
        await bot.wait_for_fake(lambda r: r["op"] == "edit" and not r["final"] and len(r["text"]) > 10)
        bot.process.send_signal(signal.SIGINT)
        code = await bot.finish()
    finally:
        await bot.kill()
    assert code == 0, f"{bot.output()}\n{await bot.stderr()}"
    assert "durable-bots: stopping (SIGINT)" in bot.output() and "stopped cleanly" in bot.output()
    storage = await SqliteStorage.open(tmp_path / "bot.sqlite")
    try:
        live = (await storage.scan_tasks(live=True, limit=100)).items
    finally:
        await storage.close()
    assert live, "the interrupted answer must still be there to resume"
    assert all(t.state.status != "running" and t.restarts == 0 for t in live)  # not counted as a crash


USAGE_LINE = re.compile(
    r"^usage: (\d+) input \+ (\d+) output tokens \(cache read (\d+), write (\d+)\), cost \$(\d+\.\d{4})$"
)


async def test_inspect_shows_token_usage_and_a_task_blocked_by_a_removed_plugin(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    messages = [call("start_watch", {})]
    config = write_config(tmp_path, messages=messages, modules=["bots_crash_tools", "bots_watch_tools"])
    bot = await BotProcess.start(config, env=env)
    try:
        await bot.wait_for_fake(lambda r: r.get("final") is True and "watch task" in r["text"])
        assert await bot.terminate() == 0
    finally:
        await bot.kill()

    # With the plugin the timer is an ordinary waiting task; the usage section counts both model turns.
    inspected = await cli(config, "inspect", env=env)
    assert inspected.returncode == 0, inspected.stderr
    lines = inspected.stdout.splitlines()
    (watch,) = [line for line in lines if "watch.timer" in line]
    assert " waiting " in watch and "until" in watch and "BLOCKED" not in watch, inspected.stdout
    (usage,) = [m for m in map(USAGE_LINE.match, lines) if m]
    tokens_in, tokens_out = int(usage.group(1)), int(usage.group(2))
    assert tokens_in > 0 and tokens_out > 0, usage.group(0)
    report = json.loads((await cli(config, "inspect", "--json", env=env)).stdout)
    total = report["usage"]["total"]
    assert (total["input"], total["output"]) == (tokens_in, tokens_out)
    (model,) = report["usage"]["models"]
    per_model = f"  {model}: {tokens_in} in / {tokens_out} out, ${total['cost']:.4f}"
    assert per_model in lines, inspected.stdout
    assert model == "faux/demo"

    # The operator removed the plugin from the config: the task's code is gone, so it is blocked (and kept).
    lacking = write_config(tmp_path, messages=messages, name="without-watch.toml")
    blocked = await cli(lacking, "inspect", env=env)
    assert blocked.returncode == 0, blocked.stderr
    (line,) = [line for line in blocked.stdout.splitlines() if "watch.timer" in line]
    assert "BLOCKED (missing_task)" in line, blocked.stdout
    assert "tasks (1 blocked):" in blocked.stdout
    tasks = json.loads((await cli(lacking, "tasks", "--json", env=env)).stdout)["tasks"]
    assert [(t["kind"], t["state"], t["reason"]) for t in tasks] == [
        ("watch.timer", "blocked", "missing_task")
    ]
