"""Operating a running bot: reading its storage while it runs, operator requests it carries out, the admin
endpoint, reload, JSON logs, backup and doctor. Real `python -m bots` processes over one SQLite file."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from bots_cli_support import (
    LAST_LINE,
    BotProcess,
    bot_env,
    cli,
    free_port,
    ledger,
    park_the_fragile_tool,
    request_latency_ms,
    retry_the_parked_task,
    shipped_config_in,
    write_config,
    write_inbox_config,
)
from slack_ops_support import SlackBot, body, sample, slack_bot

from adapters.bridge.text import WAITING_BEHIND_HOLD
from adapters.discord.testing import FakeDiscord
from adapters.slack.testing import FakeSlack
from harness_core.storage import SqliteStorage

Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]

pytestmark = pytest.mark.slow


async def test_read_commands_show_a_snapshot_while_the_bot_runs(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path, messages=[{"id": "1", "text": "hello"}])
    bot = await BotProcess.start(config, env=env)
    try:
        final = await bot.wait_for_fake(lambda r: r["op"] == "edit" and r["final"])
        lock = (tmp_path / "bot.sqlite.lock").read_text()
        inspected, tasks, approvals, as_json = await asyncio.gather(
            cli(config, "inspect", env=env),
            cli(config, "tasks", env=env),
            cli(config, "approvals", env=env),
            cli(config, "inspect", "--json", env=env),
        )
        for result in (inspected, tasks, approvals, as_json):
            assert result.returncode == 0, result.stderr
        assert "a snapshot read beside the running bot" in inspected.stdout
        report = json.loads(as_json.stdout)
        assert report["snapshot_beside_running_bot"] is True
        (conversation,) = [c for c in report["conversations"] if c["place"]]
        exported = await cli(config, "export", str(conversation["id"]), env=env)
        assert exported.returncode == 0, exported.stderr
        entries = [json.loads(line) for line in exported.stdout.splitlines()]
        assert entries[0]["model"][0]["content"] == "alice: hello"
        said = [e for e in entries if e["kind"] == "core.assistant"][-1]["model"][0]["content"]
        assert [part["text"] for part in said] == [final["text"]]
        # Nothing was written and the owner lock is the bot's, untouched; the bot keeps answering.
        assert (tmp_path / "bot.sqlite.lock").read_text() == lock
        assert await bot.terminate() == 0
    finally:
        await bot.kill()


async def test_admin_endpoint_probes_and_metrics_follow_the_bot_on_slack(tmp_path: Path) -> None:
    async with slack_bot(tmp_path) as s:
        assert (await s.get("healthz"))[0] == 200
        status, ready = await s.get("readyz")
        assert (status, body(ready)) == (200, {"ready": True})
        before = await s.metrics()
        assert sample(before, "durable_bots_messages_taken_in_total", platform="slack") == 0
        assert sample(before, "durable_bots_adapter_connected", platform="slack") == 1

        # A message: taken in, answered (model request), delivered, written to Slack; one write gets a 429.
        s.slack.rate_limit("chat.update", times=1, retry_after=1)
        await s.slack.user_posts(s.channel, s.alice, "hello")
        answer = await s.slack.wait_for_message(s.channel, contains=LAST_LINE, timeout=30)
        # Read while running: inspect and export see what was said on Slack.
        report = json.loads((await cli(s.config, "inspect", "--json", env=s.env)).stdout)
        (conversation,) = [c for c in report["conversations"] if c["place"]]
        exported = await cli(s.config, "export", str(conversation["id"]), env=s.env)
        entries = [json.loads(line) for line in exported.stdout.splitlines()]
        assert entries[0]["model"][0]["content"] == "Alice: hello"
        said = [e for e in entries if e["kind"] == "core.assistant"][-1]["model"][0]["content"]
        assert [part["text"] for part in said] == [answer.text]
        after = await s.until(
            lambda: _when(
                s, lambda m: sample(m, "durable_bots_answers_delivered_total", platform="slack") == 1
            )
        )
        assert sample(after, "durable_bots_messages_taken_in_total", platform="slack") == 1
        assert sample(after, "durable_bots_platform_rate_limited_total", platform="slack") == 1
        assert sample(after, "durable_bots_platform_writes_total", platform="slack") >= 2
        assert sample(after, "durable_bots_model_requests_total", model="faux:demo", outcome="ok") >= 1
        assert sample(after, "durable_bots_commit_seconds_count") > 0
        assert ("durable_bots_event_loop_lag_seconds", ()) in after

        # A tool run and an approval: pending while the card waits, decided after the approver's click.
        await s.slack.user_posts(s.channel, s.alice, "deploy checkout 1.4.3")
        card, gate = await s.approval_card()
        pending = await s.until(lambda: _when(s, lambda m: sample(m, "durable_bots_approvals_pending") == 1))
        assert sample(pending, "durable_bots_approvals_decided_total", outcome="approved") == 0
        await s.click(card, gate, s.lead)
        decided = await s.until(
            lambda: _when(
                s, lambda m: sample(m, "durable_bots_tool_runs_total", tool="deploy", outcome="ok") == 1
            )
        )
        assert sample(decided, "durable_bots_approvals_decided_total", outcome="approved") == 1
        assert sample(decided, "durable_bots_approvals_pending") == 0

        # The socket drops and Slack refuses new ones: not ready, naming slack; ready again once it reconnects.
        refused = s.slack.fail("apps.connections.open", times=None)
        await s.slack.drop_connections()

        async def not_ready() -> dict[str, object] | None:
            status, text = await s.get("readyz")
            return body(text) if status == 503 else None

        down = await s.until(not_ready)
        assert down["ready"] is False and "slack" in down["not_ready"], down
        assert (await s.get("healthz"))[0] == 200  # alive, only not ready
        refused.cancel()

        async def ready_again() -> bool:
            return (await s.get("readyz"))[0] == 200

        await s.until(ready_again, 30)
        assert sample(await s.metrics(), "durable_bots_reconnects_total", platform="slack") >= 1
        assert await s.bot.terminate() == 0, await s.bot.stderr()


async def _when(s: SlackBot, predicate: Callable[[Metrics], bool]) -> Metrics | None:
    found = await s.metrics()
    return found if predicate(found) else None


def call(tool: str, arguments: dict[str, object], message_id: str) -> dict[str, str]:
    return {"id": message_id, "text": f"/call {tool} {json.dumps(arguments)}"}


def sqlite_request_latency_ms(workdir: Path, request_id: int) -> Awaitable[int]:
    return request_latency_ms(SqliteStorage.open_read_only(workdir / "bot.sqlite"), request_id)


async def test_retry_of_a_parked_task_reaches_the_running_bot(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    question = {"id": "2", "text": "is the build green?", "user": "U2", "name": "bob"}
    config = write_config(tmp_path, messages=[call("fragile", {}, "1"), question], restart_limit=1)
    await park_the_fragile_tool(config, env)
    bot = await BotProcess.start(config, env=env)
    try:
        # The channel is told, in its terms, why the answer stopped and why bob's question waits.
        held = await bot.wait_for_fake(lambda r: "on hold" in r["text"] and "`fragile`" in r["text"])
        waiting = await bot.wait_for_fake(lambda r: r["op"] == "create" and r["id"] != held["id"])
        assert waiting["text"] == WAITING_BEHIND_HOLD
        task_id = await retry_the_parked_task(bot, config, env)
        assert held["text"] == (
            "⚠️ The bot stopped 2 times in a row while running `fragile`, so that is on hold until an operator "
            f"retries it (task {task_id})."
        )
        assert await sqlite_request_latency_ms(tmp_path, 1) < 1500  # picked up within about a second
        # The bot itself delivers the model's answer to the tool result, in the message that showed the hold.
        answer = await bot.wait_for_fake(
            lambda r: r["op"] == "edit" and r["final"] and "worked this time" in r["text"]
        )
        assert answer["id"] == held["id"] and "on hold" not in answer["text"]
        # Bob's question is answered next, in the message that said it waited: one message, no second post.
        bobs = await bot.wait_for_fake(
            lambda r: r["op"] == "edit" and r["final"] and r["id"] == waiting["id"]
        )
        assert "on hold" not in bobs["text"] and "Waiting" not in bobs["text"]
        again = await cli(config, "retry", str(task_id), env=env)
        assert again.returncode == 1 and "already ended; nothing to retry" in again.stderr
        assert await bot.terminate() == 0
    finally:
        await bot.kill()


async def test_cancel_of_a_parked_task_gives_it_up_and_the_answer_moves_on(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path, messages=[call("fragile", {}, "1")], restart_limit=1)
    await park_the_fragile_tool(config, env)
    bot = await BotProcess.start(config, env=env)
    try:
        held = await bot.wait_for_fake(lambda r: "on hold" in r["text"])
        task_id = int(held["text"].split("(task ")[1].rstrip(").").strip())
        cancelled = await cli(config, "cancel", str(task_id), env=env)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert "is being cancelled (by the running bot)" in cancelled.stdout
        # Its abort runs (not the tool again): the answer ends, in the message that showed the hold.
        final = await bot.wait_for_fake(lambda r: r["op"] == "edit" and r["final"] and r["id"] == held["id"])
        assert "on hold" not in final["text"]
        assert ledger(tmp_path) == ["fragile", "fragile"]  # the two runs that killed it, none after
        tasks = json.loads((await cli(config, "tasks", "--json", env=env)).stdout)["tasks"]
        assert task_id not in [t["id"] for t in tasks]
        assert await bot.terminate() == 0
    finally:
        await bot.kill()


async def test_an_operator_denial_and_a_cancel_reach_the_running_bot(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config, inbox = write_inbox_config(tmp_path, "1", "deploy checkout 1.4.3")
    bot = await BotProcess.start(config, env=env)
    try:
        card = await bot.wait_for_fake(lambda r: r["op"] == "approval")
        gate = int(card["gate"])
        usage = await cli(config, "approvals", "decide", str(gate), "deny", env=env)
        assert usage.returncode == 2 and "--as NAME" in usage.stderr
        denied = await cli(config, "approvals", "decide", str(gate), "deny", "--as", "oncall", env=env)
        assert denied.returncode == 0, denied.stderr
        assert f"gate {gate} denied by oncall (operator override) (by the running bot)" in denied.stdout
        assert await sqlite_request_latency_ms(tmp_path, 1) < 1500
        await bot.wait_for_fake(lambda r: r["op"] == "edit" and r["final"] and "denied" in r["text"].lower())
        twice = await cli(config, "approvals", "decide", str(gate), "approve", "--as", "oncall", env=env)
        assert twice.returncode == 1 and "already denied by oncall (operator override)" in twice.stderr
        listed = json.loads((await cli(config, "approvals", "--json", env=env)).stdout)["approvals"]
        (decided,) = [g for g in listed if g["id"] == gate]
        assert decided["status"] == "denied" and decided["operator_override"] is True
        assert not (tmp_path / "deploys.jsonl").exists()  # nothing was deployed

        # A second deploy waits for its approver; the operator cancels the task that waits for it instead.
        inbox.write_text(json.dumps({"id": "2", "text": "deploy payments 2.8.0"}) + "\n")
        second = await bot.wait_for_fake(lambda r: r["op"] == "approval" and r["gate"] != gate)
        tasks = json.loads((await cli(config, "tasks", "--json", env=env)).stdout)["tasks"]
        (waiting,) = [t for t in tasks if t["gate"] == int(second["gate"])]
        cancelled = await cli(config, "cancel", str(waiting["id"]), env=env)
        assert cancelled.returncode == 0, cancelled.stderr
        assert "is being cancelled (by the running bot)" in cancelled.stdout
        tasks = json.loads((await cli(config, "tasks", "--json", env=env)).stdout)["tasks"]
        assert waiting["id"] not in [t["id"] for t in tasks]
        # The request can never be decided now: its card says so instead of keeping working buttons.
        listed = json.loads((await cli(config, "approvals", "--json", env=env)).stdout)["approvals"]
        (closed,) = [g for g in listed if g["id"] == int(second["gate"])]
        assert closed["status"] == "withdrawn"
        assert not (tmp_path / "deploys.jsonl").exists()
        assert await bot.terminate() == 0
    finally:
        await bot.kill()


def deploys(workdir: Path) -> list[dict[str, object]]:
    path = workdir / "deploys.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_sighup_adds_an_approver_and_a_bad_file_keeps_the_running_config(tmp_path: Path) -> None:
    async with slack_bot(tmp_path) as s:
        carol = s.slack.add_user("UCAROL", name="carol", display_name="Carol")
        await s.slack.user_posts(s.channel, s.alice, "deploy checkout 1.4.3")
        card, gate = await s.approval_card()
        await s.click(card, gate, carol)  # not an approver (yet): refused, the card stays
        await asyncio.sleep(0.5)
        assert deploys(tmp_path) == [] and any(b.get("type") == "actions" for b in card.blocks or [])
        await s.click(card, gate, s.lead)
        await s.until(lambda: _true(len(deploys(tmp_path)) == 1))

        # A broken file: refused with its line, nothing changes, the bot keeps running.
        text = s.config.read_text()
        s.config.write_text(text.replace("expires_minutes = 30", 'expires_minutes = "soon"'))
        s.bot.process.send_signal(signal.SIGHUP)
        refused = await s.bot.wait_for(lambda line: "reload refused" in line)
        assert refused is not None and "1 problem(s)" in refused

        s.config.write_text(
            text.replace('approvers = ["slack:ULEAD"]', 'approvers = ["slack:ULEAD", "slack:UCAROL"]')
        )
        s.bot.process.send_signal(signal.SIGHUP)
        assert await s.bot.wait_for(lambda line: "durable-bots: reloaded" in line) is not None
        await s.slack.user_posts(s.channel, s.alice, "deploy payments 2.8.0")

        async def second_card() -> tuple[object, int] | None:
            card, found = await s.approval_card()
            return (card, found) if found != gate else None

        card2, gate2 = await s.until(second_card)
        await s.click(card2, gate2, carol)  # carol's click counts now
        await s.until(lambda: _true(len(deploys(tmp_path)) == 2))
        assert await s.bot.terminate() == 0
        stderr = await s.bot.stderr()
        assert f"{s.config}:" in stderr and "approvals.expires_minutes" in stderr, stderr


async def _true(value: bool) -> bool:
    return value


async def test_json_logs_are_one_object_per_line_with_the_ids_in_play(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config, inbox = write_inbox_config(tmp_path, "m-1", "deploy checkout 1.4.3")
    bot = await BotProcess.start(config, "--log-format", "json", "--log-level", "INFO", env=env)
    try:
        card = await bot.wait_for_fake(lambda r: r["op"] == "approval")
        click = {"click": card["gate"], "user": "U-lead", "name": "lead", "approve": True}
        inbox.write_text(json.dumps(click) + "\n")
        # The gate's outcome is a turn of its own: wait for its answer, not the "awaits approval" one.
        await bot.wait_for_fake(lambda r: r["op"] == "edit" and r["final"] and "was approved by" in r["text"])
        assert await bot.terminate() == 0
        lines = (await bot.stderr()).splitlines()
    finally:
        await bot.kill()
    records = [json.loads(line) for line in lines]  # every line parses
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    (intake,) = [r for r in records if r["message"] == "message m-1 taken in: answering"]
    assert intake["platform_message"] == "m-1" and intake["place"] == "fake:W1:C1"
    assert isinstance(intake["conversation"], int) and isinstance(intake["submission"], int)
    (deploy,) = [r for r in records if r["message"].startswith("deploy of checkout 1.4.3")]
    # The approved call runs in the task that waited for its gate (tasks --json names it with "gate").
    assert isinstance(deploy["task"], int) and deploy["conversation"] == intake["conversation"]
    assert deploy["level"] == "INFO" and deploy["time"].endswith("Z")
    delivered = [r for r in records if r["message"].startswith("answer delivered")]
    assert delivered and all("submission" in r for r in delivered)


async def test_backup_while_the_bot_runs_is_a_consistent_private_copy(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path, messages=[{"id": "1", "text": "hello"}])
    bot = await BotProcess.start(config, env=env)
    try:
        await bot.wait_for_fake(lambda r: r["op"] == "edit" and r["final"])
        target = tmp_path / "backups" / "bot-copy.sqlite"
        done = await cli(config, "backup", str(target), env=env)
        assert done.returncode == 0, done.stderr
        assert f"to {target}" in done.stdout
        assert (target.stat().st_mode & 0o777) == 0o600
        assert not list(target.parent.glob("*.part")) and not list(target.parent.glob("*-wal"))
        # The copy is a storage of its own: it opens (taking its own lock) and holds the conversation.
        copy = await SqliteStorage.open(target)
        try:
            conversations = (await copy.scan_conversations()).items
            entries = [e for c in conversations for e in (await copy.scan_entries(c.id)).items]
            assert any(e.kind == "core.user" for e in entries)
        finally:
            await copy.close()
        assert bot.process.returncode is None  # the bot never noticed
        assert await bot.terminate() == 0
    finally:
        await bot.kill()


async def test_doctor_names_a_bad_bot_token_and_a_model_endpoint_that_refuses(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        append = '\n[adapters.slack]\nmode = "socket"\n'
        config = shipped_config_in(tmp_path, append=append)
        healthy = await cli(config, "doctor", env=bot_env(tmp_path, **slack.env))
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert "ok   slack auth.test: bot token works" in healthy.stdout
        assert "ok   slack apps.connections.open" in healthy.stdout
        assert "ok   model faux:demo" in healthy.stdout

        refusing = f"http://127.0.0.1:{free_port()}/v1"
        broken = shipped_config_in(
            tmp_path, append=append, replace={'model = "faux:demo"': 'model = "openai:gpt-4o"'}
        )
        env = bot_env(
            tmp_path,
            **{**slack.env, "SLACK_BOT_TOKEN": "xoxb-not-the-right-one"},
            OPENAI_BASE_URL=refusing,
            OPENAI_API_KEY="test-key-for-doctor",
            DEPLOY_WEBHOOK_URL=f"http://user:pw@127.0.0.1:{free_port()}/hook?token=abc",
        )
        sick = await cli(broken, "doctor", env=env)
    assert sick.returncode == 1, sick.stdout + sick.stderr
    lines = sick.stdout.splitlines()
    auth = lines.index(next(line for line in lines if line.startswith("FAIL slack auth.test")))
    assert (
        "invalid_auth" in lines[auth] and "SLACK_BOT_TOKEN" in lines[auth + 1] and "fix:" in lines[auth + 1]
    )
    model = next(line for line in lines if line.startswith("FAIL model openai:gpt-4o"))
    assert refusing.rsplit("/", 1)[0] in model
    assert any(line.startswith("FAIL deploy webhook") for line in lines)
    assert "ok   slack apps.connections.open" in sick.stdout  # the app token is still fine
    for secret in ("xoxb-not-the-right-one", "test-key-for-doctor", "pw@", "token=abc"):
        assert secret not in sick.stdout + sick.stderr
    assert lines[-1].endswith("failed") and not lines[-1].startswith("0 ok")


async def test_with_no_bot_running_decide_and_cancel_act_on_the_storage_for_the_next_start(
    tmp_path: Path,
) -> None:
    env = bot_env(tmp_path)
    config, inbox = write_inbox_config(
        tmp_path, "1", "deploy checkout 1.4.3", '\n[logging]\nformat = "json"\n'
    )

    async def run_until(predicate: Callable[[dict[str, object]], bool]) -> dict[str, object]:
        bot = await BotProcess.start(config, "--log-level", "INFO", env=env)
        try:
            found = await bot.wait_for_fake(predicate)
            assert await bot.terminate() == 0
            # [logging] format = "json" in the file: stderr is JSON lines without the command-line flag.
            assert all(json.loads(line)["level"] for line in (await bot.stderr()).splitlines())
        finally:
            await bot.kill()
        return found

    first = await run_until(lambda r: r["op"] == "approval")
    approved = await cli(
        config, "approvals", "decide", str(first["gate"]), "approve", "--as", "oncall", env=env
    )
    assert approved.returncode == 0, approved.stderr
    assert (
        f"gate {first['gate']} approved by oncall (operator override); the bot carries it out"
        in approved.stdout
    )
    assert deploys(tmp_path) == []  # nothing ran in the command's process
    inbox.write_text(json.dumps({"id": "2", "text": "deploy payments 2.8.0"}) + "\n")
    second = await run_until(lambda r: r["op"] == "approval" and r["gate"] != first["gate"])
    assert [(d["service"], d["approved_by"]) for d in deploys(tmp_path)] == [
        ("checkout", "oncall (operator override)")
    ]
    tasks = json.loads((await cli(config, "tasks", "--json", env=env)).stdout)["tasks"]
    (waiting,) = [t for t in tasks if t["gate"] == int(second["gate"])]  # the task that waits for the gate
    cancelled = await cli(config, "cancel", str(waiting["id"]), env=env)
    assert cancelled.returncode == 0 and "marked for cancellation" in cancelled.stdout, cancelled.stderr
    # Its card closes at the next start: the request can never be decided now.
    await run_until(lambda r: r["op"] == "approval_update" and r["status"] == "withdrawn")
    assert len(deploys(tmp_path)) == 1  # the cancelled deploy never ran
    tasks = json.loads((await cli(config, "tasks", "--json", env=env)).stdout)["tasks"]
    assert waiting["id"] not in [t["id"] for t in tasks]


async def test_doctor_checks_the_discord_token_and_the_message_content_intent(tmp_path: Path) -> None:
    async with FakeDiscord(message_content_granted=False) as discord:
        config = shipped_config_in(tmp_path, append="\n[adapters.discord]\n")
        off = await cli(config, "doctor", env=bot_env(tmp_path, **discord.env()))
        discord.message_content_granted = True
        on = await cli(config, "doctor", env=bot_env(tmp_path, **discord.env()))
        wrong = await cli(
            config, "doctor", env=bot_env(tmp_path, **{**discord.env(), "DISCORD_BOT_TOKEN": "nope"})
        )
    assert off.returncode == 1 and "ok   discord gateway/bot: bot token works" in off.stdout
    assert (
        "FAIL discord intents: MESSAGE CONTENT intent is off" in off.stdout
        and "Privileged Gateway" in off.stdout
    )
    assert on.returncode == 0, on.stdout
    assert "ok   discord intents: MESSAGE CONTENT intent enabled" in on.stdout
    assert wrong.returncode == 1 and "FAIL discord gateway/bot: Discord refused the bot token" in wrong.stdout
