"""What the model sees in a fork: the parent's context up to the fork point and nothing after, with a tool
call cut off by the fork closed by a synthesized result. Also the whole harness over JSONL storage."""

from __future__ import annotations

from pathlib import Path

from harness_core import CORE_ASSISTANT, Input, RequestIdConflict, tool
from harness_core.messages import AssistantMessage, SystemMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models.faux import faux_assistant, faux_tool_call
from harness_core.storage import JsonlStorage

from .helpers import FAUX, open_harness
from .test_tools import call_then_answer


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def test_a_fork_at_a_tool_call_sees_a_synthesized_result_and_nothing_later() -> None:
    harness, faux = await open_harness(
        tools=[lookup], responder=call_then_answer(faux_tool_call("lookup", {"key": "db"}, id="k1"))
    )
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("what is db?"))).wait()
    entries = (await root.entries(limit=50, order="asc")).items
    call_entry = next(
        e
        for e in entries
        if e.kind == CORE_ASSISTANT
        and any(isinstance(m, AssistantMessage) and m.tool_calls() for m in e.model or ())
    )

    fork = await root.fork(call_entry.id)
    view = await fork.context()
    conversation = [m for m in view.messages if not isinstance(m, SystemMessage)]
    kinds = [type(m).__name__ for m in conversation]
    assert kinds == ["UserMessage", "AssistantMessage", "ToolResultMessage"]
    synthesized = conversation[2]
    assert isinstance(synthesized, ToolResultMessage) and synthesized.is_error
    assert synthesized.tool_call_id == "k1"
    assert "value of db" not in synthesized.text()  # the parent's real result came after the fork point

    await (await root.submit(Input("and cache?"))).wait()  # the parent moves on
    later = [m for m in (await fork.context()).messages if not isinstance(m, SystemMessage)]
    assert [type(m).__name__ for m in later] == kinds  # the fork does not see it

    faux.set_responder(lambda r: faux_assistant(f"fork saw {len(r.messages)} messages"))
    await (await fork.submit(Input("in the fork"))).wait()
    sent = faux.requests[-1].messages
    assert [user_text(m) for m in sent if isinstance(m, UserMessage)] == ["what is db?", "in the fork"]
    assert not any(isinstance(m, AssistantMessage) and "and cache" in str(m) for m in sent)
    await harness.close()


async def test_the_harness_over_jsonl_keeps_submissions_exactly_once_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store"
    harness, _ = await open_harness(
        storage=await JsonlStorage.open(path), responder=lambda r: faux_assistant("noted")
    )
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("remember the deploy window", request_id="msg-1"))
    await first.wait()
    fork = await root.fork((await root.entries(limit=1)).items[0].id)
    await harness.close()

    reopened, faux = await open_harness(
        storage=await JsonlStorage.open(path), responder=lambda r: faux_assistant("again")
    )
    root = await reopened.root()
    again = await root.submit(Input("remember the deploy window", request_id="msg-1"))
    assert again.id == first.id  # the same submission; nothing new written
    try:
        await root.submit(Input("something else", request_id="msg-1"))
        raise AssertionError("a reused request id with other content must conflict")
    except RequestIdConflict:
        pass
    submissions = await reopened.session.storage.scan_submissions(conversation_id=root.id)
    assert len(submissions.items) == 1
    assert faux.requests == []  # nothing re-answered
    forked = await reopened.conversation(fork.id)
    assert forked is not None
    await (await forked.submit(Input("in the fork"))).wait()
    assert len(faux.requests) == 1
    await reopened.close()
