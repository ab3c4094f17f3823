"""Context derivation (DESIGN.md §2.4): one test per rule, on hand-built entries (the function is pure)."""

from __future__ import annotations

import random

from harness_core import CORE_ASSISTANT, CORE_COMPACTION, CORE_RESET, CORE_SYSTEM, CORE_TOOL_RESULT, CORE_USER
from harness_core.context import (
    MISSING_RESULT_TEXT,
    derive_context,
    extend_context,
    provider_messages,
    replay_system,
)
from harness_core.messages import (
    AssistantMessage,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolDeclaration,
    ToolResultMessage,
    UserMessage,
)
from harness_core.records import ContextEdit, Entry


def user(entry_id: int, text: str, **extra: object) -> Entry:
    return Entry(id=entry_id, conversation_id=1, kind=CORE_USER, model=[UserMessage(content=text)], **extra)  # type: ignore[arg-type]


def assistant(
    entry_id: int, text: str = "", calls: list[ToolCall] | None = None, stop: str = "stop"
) -> Entry:
    content: list[TextContent | ToolCall] = [TextContent(text=text)] if text else []
    content.extend(calls or [])
    return Entry(
        id=entry_id,
        conversation_id=1,
        kind=CORE_ASSISTANT,
        model=[AssistantMessage(content=content, stop_reason=stop)],  # type: ignore[arg-type]
    )


def result(entry_id: int, call_id: str, text: str = "ok") -> Entry:
    return Entry(
        id=entry_id,
        conversation_id=1,
        kind=CORE_TOOL_RESULT,
        model=[ToolResultMessage(tool_call_id=call_id, tool_name="t", content=[TextContent(text=text)])],
    )


def roles(messages: list[object]) -> list[str]:
    out = []
    for m in messages:
        if isinstance(m, UserMessage):
            out.append(f"user:{m.content}")
        elif isinstance(m, AssistantMessage):
            out.append(f"assistant:{m.text()}")
        elif isinstance(m, ToolResultMessage):
            out.append(f"result:{m.tool_call_id}")
        else:
            out.append("system")
    return out


def test_plain_transcript_in_order() -> None:
    view = derive_context(None, [user(1, "a"), assistant(2, "b"), user(3, "c")])
    assert roles(view.messages) == ["user:a", "assistant:b", "user:c"]


def test_context_starts_at_newest_reset_marker() -> None:
    reset = Entry(id=3, conversation_id=1, kind=CORE_RESET, head=3, model=[UserMessage(content="handoff")])
    view = derive_context(reset, [reset, user(4, "after")])
    assert roles(view.messages) == ["user:handoff", "user:after"]
    assert [e.id for e in view.entries] == [3, 4]


def test_compaction_marker_goes_first_then_kept_entries() -> None:
    # Summary entry 5 keeps entries from 3 on: context = summary, then 3, 4, then what came after 5.
    summary = Entry(
        id=5, conversation_id=1, kind=CORE_COMPACTION, head=3, model=[UserMessage(content="summary")]
    )
    view = derive_context(summary, [user(3, "kept"), assistant(4, "kept answer"), summary, user(6, "new")])
    assert roles(view.messages) == ["user:summary", "user:kept", "assistant:kept answer", "user:new"]


def test_omit_edit_removes_target() -> None:
    editor = Entry(id=3, conversation_id=1, kind="app.edit", edits=[ContextEdit(target=1, action="omit")])
    view = derive_context(None, [user(1, "secret"), user(2, "keep"), editor])
    assert roles(view.messages) == ["user:keep"]


def test_newest_replace_edit_wins() -> None:
    first = Entry(
        id=3,
        conversation_id=1,
        kind="app.edit",
        edits=[ContextEdit(target=1, action="replace", messages=[UserMessage(content="v1")])],
    )
    second = Entry(
        id=4,
        conversation_id=1,
        kind="app.edit",
        edits=[ContextEdit(target=1, action="replace", messages=[UserMessage(content="v2")])],
    )
    view = derive_context(None, [user(1, "original"), user(2, "x"), first, second])
    assert roles(view.messages) == ["user:v2", "user:x"]


def test_tool_results_move_directly_after_their_call() -> None:
    # A steered user message landed between the call and its result: the result moves up.
    call = ToolCall(id="c1", name="t")
    view = derive_context(
        None, [user(1, "go"), assistant(2, calls=[call], stop="toolUse"), user(3, "steer"), result(4, "c1")]
    )
    assert roles(view.messages) == ["user:go", "assistant:", "result:c1", "user:steer"]


def test_results_follow_call_order() -> None:
    calls = [ToolCall(id="a", name="t"), ToolCall(id="b", name="t")]
    view = derive_context(None, [assistant(1, calls=calls, stop="toolUse"), result(2, "b"), result(3, "a")])
    assert roles(view.messages) == ["assistant:", "result:a", "result:b"]


def test_call_without_result_gets_synthesized_error() -> None:
    call = ToolCall(id="c1", name="deploy")
    view = derive_context(None, [user(1, "go"), assistant(2, calls=[call], stop="toolUse")])
    synthesized = view.messages[-1]
    assert isinstance(synthesized, ToolResultMessage)
    assert synthesized.is_error and synthesized.tool_name == "deploy"
    assert synthesized.text() == MISSING_RESULT_TEXT


def test_orphan_result_is_dropped() -> None:
    view = derive_context(None, [user(1, "a"), result(2, "nobody-called-me")])
    assert roles(view.messages) == ["user:a"]


def test_result_after_a_later_assistant_is_an_orphan() -> None:
    call = ToolCall(id="c1", name="t")
    entries = [assistant(1, calls=[call], stop="toolUse"), assistant(2, "next"), result(3, "c1")]
    view = derive_context(None, entries)
    # The call gets a synthesized result; the late result is dropped.
    assert roles(view.messages) == ["assistant:", "result:c1", "assistant:next"]
    assert isinstance(view.messages[1], ToolResultMessage) and view.messages[1].is_error


def test_aborted_and_error_assistants_and_modelless_entries_are_excluded() -> None:
    entries = [
        user(1, "q"),
        assistant(2, "partial", stop="aborted"),
        assistant(3, "503", stop="error"),
        Entry(id=4, conversation_id=1, kind="app.note", data={"x": 1}),
        assistant(5, "answer"),
    ]
    view = derive_context(None, entries)
    assert roles(view.messages) == ["user:q", "assistant:answer"]


def test_system_preceded_only_by_users_moves_to_front() -> None:
    system = Entry(id=2, conversation_id=1, kind=CORE_SYSTEM, model=[SystemMessage(sections={"a": "A"})])
    view = derive_context(None, [user(1, "first"), system, assistant(3, "x")])
    assert roles(view.messages) == ["system", "user:first", "assistant:x"]
    later = derive_context(None, [user(1, "u"), assistant(2, "x"), system.model_copy(update={"id": 3})])
    assert roles(later.messages) == ["user:u", "assistant:x", "system"]


def test_replay_system_patches_and_provider_messages() -> None:
    declaration = ToolDeclaration(name="a")
    patches = [
        SystemMessage(sections={"x": "X", "y": "Y"}, tools_added=[declaration, ToolDeclaration(name="b")]),
        SystemMessage(sections={"x": None, "z": "Z"}, tools_removed=["a"]),
    ]
    state = replay_system([*patches, UserMessage(content="u")])
    assert state.sections == {"y": "Y", "z": "Z"}
    assert [t.name for t in state.tools] == ["b"]
    assert state.system_prompt() == "Y\n\nZ"
    assert roles(provider_messages([*patches, UserMessage(content="u")])) == ["user:u"]


def test_call_ids_repeated_across_turns_pair_with_their_own_results() -> None:
    # Some models number call ids per turn ("call_0" every turn).
    first = ToolCall(id="call_0", name="t")
    second = ToolCall(id="call_0", name="t")
    entries = [
        user(1, "zurich?"),
        assistant(2, calls=[first], stop="toolUse"),
        result(3, "call_0", "zurich sunny"),
        assistant(4, "zurich is sunny"),
        user(5, "oslo?"),
        assistant(6, calls=[second], stop="toolUse"),
        result(7, "call_0", "oslo sunny"),
    ]
    view = derive_context(None, entries)
    results = [m.text() for m in view.messages if isinstance(m, ToolResultMessage)]
    assert results == ["zurich sunny", "oslo sunny"]


def _random_entry(rng: random.Random, entry_id: int, earlier: list[int]) -> Entry:
    """Any mix the rules care about: users, system patches, assistants with or without calls (some aborted
    or failed), results for recent or unknown calls, entries without messages, and edits of earlier entries."""
    call_ids = ["c1", "c2", "c3"]
    roll = rng.random()
    extra: dict[str, object] = {}
    if earlier and rng.random() < 0.08:
        target = rng.choice(earlier)
        edit = (
            ContextEdit(target=target, action="omit")
            if rng.random() < 0.5
            else ContextEdit(target=target, action="replace", messages=[UserMessage(content=f"r{entry_id}")])
        )
        extra["edits"] = [edit]
    if roll < 0.25:
        return user(entry_id, f"u{entry_id}", **extra)
    if roll < 0.32:
        return Entry(
            id=entry_id,
            conversation_id=1,
            kind=CORE_SYSTEM,
            model=[SystemMessage(sections={"a": f"s{entry_id}"})],
            **extra,  # type: ignore[arg-type]
        )
    if roll < 0.6:
        calls = [ToolCall(id=call, name="t", arguments={}) for call in rng.sample(call_ids, rng.randrange(3))]
        stop = rng.choice(["stop", "toolUse", "toolUse", "aborted", "error"])
        entry = assistant(entry_id, f"a{entry_id}" if rng.random() < 0.7 else "", calls, stop)
        return entry.model_copy(update=extra)
    if roll < 0.93:
        return result(entry_id, rng.choice([*call_ids, "x9"])).model_copy(update=extra)
    return Entry(id=entry_id, conversation_id=1, kind="test.note", **extra)  # type: ignore[arg-type]


def test_extending_a_view_equals_deriving_the_whole_range() -> None:
    rng = random.Random(2024)
    extended = 0
    for _ in range(400):
        head = None
        if rng.random() < 0.3:
            head = Entry(id=1, conversation_id=1, kind=CORE_RESET, head=1, model=[UserMessage(content="h")])
        entries: list[Entry] = [head] if head is not None else []
        for entry_id in range(2, 2 + rng.randrange(1, 30)):
            entries.append(_random_entry(rng, entry_id, [e.id for e in entries]))
        cut = rng.randrange(1, len(entries) + 1)
        view = derive_context(head, entries[:cut])
        while cut < len(entries):
            step = rng.randrange(1, 4)
            whole = derive_context(head, entries[: cut + step])
            grown = extend_context(view, entries[cut : cut + step])
            if grown is not None:
                extended += 1
                assert grown == whole
                assert grown.open_calls == whole.open_calls and grown.edits == whole.edits
            view = grown or whole
            cut += step
    assert extended > 300  # the common case (no edits, every call answered) is extended, not derived
