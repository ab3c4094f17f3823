"""A harness process that the crash tests start, kill with SIGKILL, and start again on the same store.

    python worker.py <scenario> <workdir> [options as JSON]

Scenarios model the experiments of the seed article (§6) and the rest of the issue's crash matrix. Tools
record every start in `<workdir>/ledger.txt` (appended and fsynced) so the test can count real executions
across processes. The worker prints JSON lines on stdout (`{"event": ...}`) that the test reacts to, e.g.
kills the process when a partial answer has been committed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from support import open_storage

from harness_core import (
    AgentChange,
    Block,
    Complete,
    Defer,
    Extension,
    Harness,
    HarnessSettings,
    Input,
    LiveDoc,
    ModelRef,
    Models,
    Registry,
    Task,
    TaskOwned,
    TaskRuntime,
    ToolApi,
    ToolCallInfo,
    ToolHookApi,
    Tx,
    Wait,
    define_doc,
    define_task,
    hook,
    tool,
)
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_text, faux_tool_call

WORKDIR = Path(sys.argv[2])
SCENARIO = sys.argv[1]
OPTIONS: dict[str, Any] = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
MODEL = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def ledger(line: str) -> None:
    with open(WORKDIR / "ledger.txt", "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def last(request: ModelRequest) -> Any:
    return request.messages[-1]


# --- the tracker of seed §6.5: an external system whose state survives the crash ------------------------------


def tracker_create(title: str, key: str | None) -> str:
    path = WORKDIR / "tracker.json"
    tickets: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    if key is not None:
        for ticket in tickets:
            if ticket.get("key") == key:
                return str(ticket["id"])
    ticket = {"id": f"TICKET-{len(tickets) + 1}", "title": title, "key": key}
    tickets.append(ticket)
    path.write_text(json.dumps(tickets))
    return str(ticket["id"])


# --- scenarios ------------------------------------------------------------------------------------------------


def triage() -> tuple[list[Any], Any, list[Any]]:
    """Seed §6.2: search_logs (safe) then open_ticket (default); open_ticket kills the process."""
    crash = OPTIONS.get("crash", False)

    @tool(replay="safe")
    def search_logs(pattern: str) -> str:
        """Search the service logs for a pattern."""
        ledger(f"search_logs {pattern}")
        return "3 matches: NullPointerException in OrderService.java:42"

    @tool
    def open_ticket(title: str) -> str:
        """Open a ticket in the issue tracker."""
        ledger(f"open_ticket {title}")
        if crash:
            die()
        return "Opened TICKET-1"

    def respond(request: ModelRequest) -> AssistantMessage:
        message = last(request)
        if isinstance(message, ToolResultMessage) and message.tool_name == "open_ticket":
            text = (
                "The ticket call was interrupted; check the tracker before retrying."
                if message.is_error
                else "Ticket opened."
            )
            return faux_assistant([faux_text(text)])
        if isinstance(message, ToolResultMessage) and message.tool_name == "search_logs":
            return faux_assistant([faux_tool_call("open_ticket", {"title": "NPE in OrderService"}, id="t1")])
        return faux_assistant([faux_tool_call("search_logs", {"pattern": "NullPointerException"}, id="s1")])

    return [search_logs, open_ticket], respond, []


def tracker() -> tuple[list[Any], Any, list[Any]]:
    """Seed §6.5: the effect lands, the result does not. Policies: default, safe-naive, safe-keyed."""
    policy = OPTIONS["policy"]
    crash = OPTIONS.get("crash", False)

    @tool(replay="unsafe" if policy == "default" else "safe")
    def open_ticket(title: str) -> str:
        """Open a ticket in the issue tracker."""
        ledger(f"open_ticket {title}")
        key = f"ticket:{title}" if policy == "safe-keyed" else None
        ticket = tracker_create(title, key)
        if crash:
            die()
        return f"Opened {ticket}"

    def respond(request: ModelRequest) -> AssistantMessage:
        message = last(request)
        if isinstance(message, ToolResultMessage):
            return faux_assistant(
                [faux_text("The ticket call was interrupted." if message.is_error else "Ticket opened.")]
            )
        return faux_assistant([faux_tool_call("open_ticket", {"title": "NPE in OrderService"}, id="t1")])

    return [open_ticket], respond, []


def slow_answer() -> tuple[list[Any], Any, list[Any]]:
    """A long answer streamed slowly: the test kills the process once a partial is committed."""

    def respond(request: ModelRequest) -> AssistantMessage:
        return faux_assistant(
            [faux_text("The order failures come from a null customer id in OrderService. " * 6)]
        )

    return [], respond, []


def parallel_round() -> tuple[list[Any], Any, list[Any]]:
    """Three parallel tools; `fast_a` and `fast_b` finish, `slow_c` kills the process once both are stored."""

    @tool(replay="safe")
    def fast_a() -> str:
        """A."""
        ledger("fast_a")
        return "a done"

    @tool(replay="safe")
    def fast_b() -> str:
        """B."""
        ledger("fast_b")
        return "b done"

    @tool(replay="safe")
    async def slow_c(api: ToolApi) -> str:
        """C: waits until A and B have committed results, then (first time) the process dies."""
        ledger("slow_c")
        if OPTIONS.get("crash"):
            while True:
                live = await api.harness.snapshot(LiveDoc, api.conversation_id)
                done = [s for s in live.get("tools", []) if s["status"] == "done"]
                if len(done) == 2:
                    die()
                await asyncio.sleep(0.01)
        return "c done"

    def respond(request: ModelRequest) -> AssistantMessage:
        if isinstance(last(request), ToolResultMessage):
            results = sorted(m.text() for m in request.messages if isinstance(m, ToolResultMessage))
            return faux_assistant([faux_text("all: " + ", ".join(results))])
        return faux_assistant([faux_tool_call(n, {}, id=n) for n in ("fast_a", "fast_b", "slow_c")])

    return [fast_a, fast_b, slow_c], respond, []


def crash_loop() -> tuple[list[Any], Any, list[Any]]:
    """A replay-safe tool that kills its process every time until the operator fixes things."""

    @tool(replay="safe")
    def fragile() -> str:
        """Crashes the process unless repaired."""
        ledger("fragile")
        if not (WORKDIR / "repaired").exists():
            die()
        return "worked this time"

    def respond(request: ModelRequest) -> AssistantMessage:
        if isinstance(last(request), ToolResultMessage):
            return faux_assistant([faux_text("fragile said: " + last(request).text())])
        return faux_assistant([faux_tool_call("fragile", {}, id="f1")])

    return [fragile], respond, []


def approval() -> tuple[list[Any], Any, list[Any]]:
    """A before_tool approval hook: asks once (an approval document), waits durably, memoizes the decision."""
    approvals = define_doc(
        "test.approvals", scope="session", family=True, initial=lambda seed: {"status": "pending", **seed}
    )

    @tool
    def deploy(service: str) -> str:
        """Deploy a service."""
        ledger(f"deploy {service}")
        return f"deployed {service}"

    async def gate(call: ToolCallInfo, api: ToolHookApi) -> Any:
        key = f"approval:{call.call_id}"
        decided = await api.memo(key)
        if decided is None:
            doc = await api.harness.snapshot(approvals, key=str(api.task_id))
            if doc is None:
                ledger("asked")

                async def ask(tx: Tx, task: Task) -> None:
                    await tx.doc(
                        approvals, key=str(task.id), seed={"tool": call.name, "arguments": call.arguments}
                    )

                await api.commit(ask)
                emit("asked", task_id=api.task_id)
                return Defer()
            if doc["status"] == "pending":
                return Defer()
            decided = await api.memo(key, doc["status"])
            emit("decided", decision=decided)
            if OPTIONS.get("crash_after_memo"):
                die()
        return None if decided == "approved" else Block("denied")

    def respond(request: ModelRequest) -> AssistantMessage:
        if isinstance(last(request), ToolResultMessage):
            return faux_assistant([faux_text("result: " + last(request).text())])
        return faux_assistant([faux_tool_call("deploy", {"service": "api"}, id="d1")])

    return [deploy], respond, [Extension("approvals", hooks=[hook("core.tool", before_tool=gate)])]


def timer() -> tuple[list[Any], Any, list[Any]]:
    """Two timers that must survive a kill while they wait: `test.timer` waits durably (`Wait(deadline=...)`,
    holding nothing), `test.nap` sleeps inside its phase (`runtime.sleep(until)` with `until` from its input,
    so a restarted phase sleeps only what is left). Each records when it fired."""

    async def arm(task: Task, runtime: TaskRuntime) -> None:
        until = int(task.input["until"])
        await runtime.commit(lambda _tx, _t: Wait(checkpoint={"phase": "fire"}, deadline=until))
        emit("waiting", task_id=task.id)

    async def fire(task: Task, runtime: TaskRuntime) -> None:
        ledger(f"fired {task.kind} early_by_ms={max(0, int(task.input['until']) - runtime.now())}")
        await runtime.commit(lambda _tx, _t: Complete("fired"))

    async def nap(task: Task, runtime: TaskRuntime) -> None:
        emit("sleeping", task_id=task.id)
        await runtime.sleep(int(task.input["until"]))
        await fire(task, runtime)

    return (
        [],
        None,
        [
            Extension(
                "timer",
                tasks=[
                    define_task("test.timer", phases={"arm": arm, "fire": fire}),
                    define_task("test.nap", phases={"nap": nap}),
                ],
            )
        ],
    )


def subagent() -> tuple[list[Any], Any, list[Any]]:
    """A replay-safe tool that runs a task-owned child conversation and finds it again on re-execution."""

    @tool(replay="safe")
    async def investigate(question: str, api: ToolApi) -> str:
        """Ask a subagent."""
        ledger("investigate")

        async def child(tx: Tx, task: Task) -> int:
            existing = await tx.conversations_owned_by(task.id)
            if existing:
                return existing[0].id
            ledger("child created")
            return (await tx.create_conversation(TaskOwned(task_id=task.id))).id

        child_id = await api.commit(child)
        handle = await api.conversation(child_id)
        assert handle is not None
        submission = await handle.submit(Input(f"subtask: {question}", request_id=f"subagent:{api.task_id}"))
        settled = await submission.wait()
        answer = await api.harness.session.storage.entry(settled.answer)
        return "child says: " + answer.model[0].text()

    def respond(request: ModelRequest) -> AssistantMessage:
        texts = [user_text(m) for m in request.messages if isinstance(m, UserMessage)]
        if texts and texts[0].startswith("subtask:"):
            emit("child_request", count=len(FAUX.requests))
            if OPTIONS.get("crash_in_child"):
                die()
            return faux_assistant([faux_text("the root cause is a null id")])
        if isinstance(last(request), ToolResultMessage):
            return faux_assistant([faux_text("parent: " + last(request).text())])
        return faux_assistant([faux_tool_call("investigate", {"question": "why do orders fail?"}, id="q1")])

    return [investigate], respond, []


def echo() -> tuple[list[Any], Any, list[Any]]:
    def respond(request: ModelRequest) -> AssistantMessage:
        texts = [user_text(m) for m in request.messages if isinstance(m, UserMessage)]
        return faux_assistant([faux_text(f"answer to {texts[-1]}")])

    return [], respond, []


SCENARIOS = {
    "triage": triage,
    "tracker": tracker,
    "slow_answer": slow_answer,
    "parallel_round": parallel_round,
    "crash_loop": crash_loop,
    "approval": approval,
    "timer": timer,
    "subagent": subagent,
    "echo": echo,
}
FAUX = FauxProvider(chunk_size=int(OPTIONS.get("chunk_size", 8)), delay_ms=float(OPTIONS.get("delay_ms", 0)))


async def main() -> None:
    tools, responder, extensions = SCENARIOS[SCENARIO]()
    if responder is not None:
        FAUX.set_responder(responder)
    registry = Registry()
    registry.install(Extension("crash", tools=tools))
    for extension in extensions:
        registry.install(extension)
    settings = HarnessSettings(restart_limit=int(OPTIONS.get("restart_limit", 5)))
    harness = await Harness.open(
        await open_storage(WORKDIR),
        models=Models(FAUX),
        registry=registry,
        settings=settings,
    )

    def on_publication(publication: Any) -> None:
        for doc in publication.docs:
            if doc.record.kind == "core.live" and (doc.value or {}).get("generation", {}).get("message"):
                emit("partial")

    harness.add_publication_listener(on_publication)
    root = await harness.root(agent=MODEL)
    action = OPTIONS.get("action", "submit")
    if action == "submit":
        submission = await root.submit(
            Input(
                OPTIONS.get("text", "Investigate the order failures."),
                request_id=OPTIONS.get("request_id", "investigate-1"),
            )
        )
        emit("submitted", id=submission.id, status=submission.record.status)
        harness.resume()
        settled = await submission.wait()
        emit("settled", status=settled.status, reason=settled.reason, answer=settled.answer)
    elif action == "submit_many":
        handles = [
            await root.submit(Input(text, request_id=f"msg-{i}")) for i, text in enumerate(OPTIONS["texts"])
        ]
        emit("submitted", ids=[h.id for h in handles])
        harness.resume()
        for handle in handles:
            settled = await handle.wait()
            emit("settled", id=handle.id, status=settled.status, answer=settled.answer)
    elif action == "resume":
        harness.resume()
        await harness.wait_for_idle()
        emit("idle")
    elif action == "start_timer":
        until = harness.now() + int(OPTIONS["delay_ms"])

        async def create(tx: Tx) -> int:
            kind = str(OPTIONS.get("kind", "test.timer"))
            return (await harness.create_task_in(tx, kind, {"until": until}, conversation_id=root.id)).id

        task_id = await harness.commit(create)
        emit("armed", task_id=task_id, until=until)
        harness.resume()
        await harness.wait_for_task(task_id)
        emit("done")
    elif action == "decide":
        approvals = define_doc(
            "test.approvals", scope="session", family=True, initial=lambda seed: {"status": "pending", **seed}
        )

        async def decide(tx: Tx) -> None:
            doc = await tx.doc(approvals, key=str(OPTIONS["task_id"]))
            if doc.value["status"] == "pending":
                doc.value["status"] = OPTIONS["decision"]
            await harness.wake_task(tx, int(OPTIONS["task_id"]))

        await harness.commit(decide)
        emit("decision_committed")
        harness.resume()
        await harness.wait_for_idle()
        emit("idle")
    elif action == "inspect":
        inspection = await harness.inspect()
        emit(
            "inspect",
            parked=[t.record.id for t in inspection.parked()],
            tasks=[[t.record.id, t.record.kind, t.state, t.record.restarts] for t in inspection.tasks],
        )
    elif action == "retry":
        await harness.retry_task(int(OPTIONS["task_id"]))
        await harness.wait_for_idle()
        emit("idle")
    await harness.close()
    emit("closed")


if __name__ == "__main__":
    asyncio.run(main())
