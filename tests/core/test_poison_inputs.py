"""Poison inputs (DESIGN.md §2.3 "Strict JSON, stored as given"): values that storage cannot keep exactly are
refused with `StrictJsonError` naming the path before the commit reaches storage, text from outside is made
valid, and neither ever closes the harness. Real SQLite files, so serialization really happens."""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness_core import (
    EntryDraft,
    Extension,
    Harness,
    Input,
    StrictJsonError,
    ToolApi,
    ToolResult,
    Write,
    define_task,
    tool,
)
from harness_core.messages import AssistantMessage, TextContent, ToolResultMessage, UserMessage
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant, faux_text, faux_tool_call
from harness_core.storage import JsonlStorage, MemoryStorage, SqliteStorage, Storage

from .helpers import FAUX, open_harness, task_reaches

pytestmark = pytest.mark.timeout(20)


class _Color(enum.Enum):
    RED = "red"


class _Mode(str, enum.Enum):  # noqa: UP042 (the mixin is the case: a str that is an enum member)
    FAST = "fast"


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


async def _sqlite(tmp_path: Path) -> Storage:
    return await SqliteStorage.open(tmp_path / "bot.sqlite")


def results_in(request: ModelRequest) -> list[ToolResultMessage]:
    return [m for m in request.messages if isinstance(m, ToolResultMessage)]


def call_then_answer(*calls: Any, answer: str = "done") -> Any:
    def respond(request: ModelRequest) -> AssistantMessage:
        if isinstance(request.messages[-1], ToolResultMessage):
            return faux_assistant([faux_text(answer)])
        return faux_assistant(list(calls), stop_reason="toolUse")

    return respond


async def tool_results(harness: Harness, conversation_id: int) -> list[ToolResultMessage]:
    root = await harness.conversation(conversation_id)
    assert root is not None
    page = await root.entries(limit=100, order="asc")
    return [m for e in page.items for m in e.model or () if isinstance(m, ToolResultMessage)]


# --- a model tool call with a lone surrogate: the headline case ------------------------------------------------


async def test_a_tool_call_with_a_lone_surrogate_is_answered_once_and_a_restart_is_clean(
    tmp_path: Path,
) -> None:
    seen: list[str] = []

    @tool
    def echo(text: str, api: ToolApi) -> ToolResult:
        """Echo."""
        seen.append(text)
        api.output("out \udc00 ")  # tool output with a lone low surrogate
        return ToolResult(content=f"echo {text} \ud83d", details={"said \ud83d": text})

    path = tmp_path / "bot.sqlite"
    respond = call_then_answer(
        faux_tool_call("echo", {"text": "broken \ud83d emoji"}, id="c1"), answer="ok \ude00"
    )
    harness, faux = await open_harness(
        storage=await SqliteStorage.open(path), tools=[echo], responder=respond
    )
    root = await harness.root(agent=FAUX)
    submission = await root.submit(Input("hi", request_id="m1"))
    settled = await submission.wait()
    assert settled.status == "done"
    assert not harness.session.failed
    assert seen == ["broken \ufffd emoji"]
    answer = await harness.entry(settled.answer or 0)
    assert answer is not None and answer.model is not None
    assert isinstance(answer.model[0], AssistantMessage) and answer.model[0].text() == "ok \ufffd"
    [result] = await tool_results(harness, root.id)
    assert result.text() == "echo broken \ufffd emoji \ufffd" and not result.is_error
    assert result.details == {"said \ufffd": "broken \ufffd emoji"}
    assert len(faux.requests) == 2
    entries = [e.id for e in (await root.entries(limit=100)).items]
    await harness.close()

    harness, faux = await open_harness(
        storage=await SqliteStorage.open(path), tools=[echo], responder=respond
    )
    root = await harness.root()
    assert (await root.submit(Input("hi", request_id="m1"))).id == submission.id  # taken in once
    assert [e.id for e in (await root.entries(limit=100)).items] == entries
    inspection = await harness.inspect()
    assert inspection.tasks == [] and inspection.submissions == []
    assert faux.requests == [] and seen == ["broken \ufffd emoji"]
    await harness.close()


async def test_model_arguments_that_are_not_strict_json_become_an_invalid_call_the_model_is_told_about(
    tmp_path: Path,
) -> None:
    ran: list[Any] = []

    @tool
    def record(value: Any) -> str:
        """Record."""
        ran.append(value)
        return "ok"

    respond = call_then_answer(faux_tool_call("record", {"value": float("nan")}, id="c1"))
    harness, _ = await open_harness(storage=await _sqlite(tmp_path), tools=[record], responder=respond)
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("go"))).wait()).status == "done"
    [result] = await tool_results(harness, root.id)
    assert result.is_error and "invalid arguments for record: NaN is not JSON" in result.text()
    assert ran == [] and not harness.session.failed
    await harness.close()


# --- public entry points refuse what storage would change or could not keep ----------------------------------


BAD_DATA: list[tuple[Any, str]] = [
    ({"x": float("nan")}, "data.x: nan is not JSON"),
    ({"x": [float("inf")]}, "data.x[0]: inf is not JSON"),
    ({"s": {1, 2}}, "data.s: set is not JSON (use a list)"),
    ({"t": (1, 2)}, "data.t: tuple is not JSON (use a list)"),
    ({"d": datetime.date(2026, 1, 1)}, "data.d: date is not JSON"),
    ({"b": b"raw"}, "data.b: bytes is not JSON"),
    ({"m": decimal.Decimal("0.1")}, "data.m: Decimal is not JSON"),
    ({"c": _Color.RED}, "data.c: _Color is not JSON (store its value: 'red')"),
    ({"c": _Mode.FAST}, "data.c: _Mode is not JSON (store its value: 'fast')"),
    ({"k": {1: "one"}}, "data.k: key 1 is not a string"),
    ({"u": "broken \ud83d emoji"}, "data.u: string is not valid Unicode"),
    ({"\ud83d": 1}, "data: key '\\ud83d' is not valid Unicode"),
    ({"n": 2**64}, "data.n: int 18446744073709551616 is outside the 64-bit range"),
    ({"deep": _nested(128)}, "nesting deeper than 128 levels"),
    ({"deep": _nested(5000)}, "nesting deeper than 128 levels"),
]


@pytest.mark.parametrize(("data", "message"), BAD_DATA, ids=[m for _, m in BAD_DATA])
@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
async def test_a_write_that_is_not_strict_json_is_refused_naming_the_path(
    tmp_path: Path, data: Any, message: str, busy: bool
) -> None:
    harness, _ = await open_harness(storage=await _sqlite(tmp_path))
    root = await harness.root(agent=FAUX if busy else None)
    if busy:  # a run that never answers keeps the conversation busy: the write would be queued
        await root.submit(Input("hold"))
    with pytest.raises(StrictJsonError) as raised:
        await root.submit(Write(EntryDraft(kind="app.note", data=data), request_id="w1"))
    assert message in str(raised.value)
    assert str(raised.value).startswith("entry app.note data")
    # Nothing was written, the harness is up, and the same request id can be used for a good write.
    assert not harness.session.failed
    good = await root.submit(Write(EntryDraft(kind="app.note", data={"ok": True}), request_id="w1"))
    assert good.record.type == "write"
    await harness.close()


async def test_inputs_with_bad_text_are_refused_and_the_harness_stays_up(tmp_path: Path) -> None:
    harness, _ = await open_harness(storage=await _sqlite(tmp_path))
    root = await harness.root()
    with pytest.raises(StrictJsonError, match=r"^input content: string is not valid Unicode"):
        await root.submit(Input("broken \ud83d emoji", request_id="i1"))
    with pytest.raises(StrictJsonError, match=r"^input content\[0\]\.text: string is not valid Unicode"):
        await root.submit(Input([TextContent(text="\udc00")], request_id="i1"))
    assert not harness.session.failed
    await root.submit(Write(EntryDraft(kind="app.note", data="still fine")))
    await harness.close()


async def test_valid_edge_values_are_stored_and_read_back_exactly(tmp_path: Path) -> None:
    data = {
        "max": 2**63 - 1,
        "min": -(2**63),
        "neg_zero": -0.0,
        "tiny": 5e-324,
        "big": 1.7976931348623157e308,
        "text": "😀 ü \u2028 \x00",
        "long": "é" * 200_000,
        "deep": _nested(127),
        "nulls": {"a": None, "b": [None]},
    }
    path = tmp_path / "bot.sqlite"
    harness, _ = await open_harness(storage=await SqliteStorage.open(path))
    root = await harness.root()
    submission = await root.submit(Write(EntryDraft(kind="app.note", data=data)))
    entry_id = (await submission.wait()).entry
    await harness.close()
    harness, _ = await open_harness(storage=await SqliteStorage.open(path))
    stored = await harness.entry(entry_id or 0)
    assert stored is not None and stored.data == data
    assert json.dumps(stored.data["neg_zero"]) == "-0.0"
    await harness.close()


async def test_task_input_memos_and_documents_refuse_bad_values(tmp_path: Path) -> None:
    from harness_core import define_doc

    notes = define_doc("app.notes", scope="conversation")
    harness, _ = await open_harness(storage=await _sqlite(tmp_path))
    root = await harness.root()

    async def bad_doc(tx: Any) -> None:
        draft = await tx.doc(notes, root.id)
        draft.value["n"] = {"\ud83d": 1}

    with pytest.raises(StrictJsonError, match=re.escape("app.notes.n: key '\\ud83d' is not valid Unicode")):
        await harness.commit(bad_doc)

    async def bad_task(tx: Any) -> None:
        await harness.create_task_in(tx, "core.generation", {"x": _nested(300)}, conversation_id=root.id)

    with pytest.raises(StrictJsonError, match=re.escape("task core.generation input.x")):
        await harness.commit(bad_task)
    assert not harness.session.failed
    await harness.close()


# --- tools: what a tool returns is checked, and a bad result is an error result the model sees ---------------


async def test_a_tool_returning_something_else_than_text_gets_an_error_result_not_its_repr() -> None:
    @tool
    def lookup() -> Any:
        """Lookup."""
        return {"id": 7}

    harness, faux = await open_harness(
        tools=[lookup], responder=call_then_answer(faux_tool_call("lookup", {}, id="l"))
    )
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("go"))).wait()).status == "done"
    [result] = await tool_results(harness, root.id)
    assert result.is_error
    assert "tool lookup returned dict; return a str or a ToolResult" in result.text()
    assert "{'id': 7}" not in result.text()
    assert results_in(faux.requests[1])[0].is_error  # the model saw it
    await harness.close()


@pytest.mark.parametrize(
    ("details", "message"),
    [
        ({"tags": {"a"}}, "details of tool report.tags: set is not JSON (use a list)"),
        ({"at": datetime.datetime(2026, 1, 1)}, "details of tool report.at: datetime is not JSON"),
        ({"score": float("nan")}, "details of tool report.score: nan is not JSON"),
        (_nested(200), "details of tool report"),
    ],
)
async def test_tool_details_that_are_not_strict_json_become_an_error_result(
    details: Any, message: str
) -> None:
    @tool
    def report() -> ToolResult:
        """Report."""
        return ToolResult(content="fine", details=details)

    harness, _ = await open_harness(
        tools=[report], responder=call_then_answer(faux_tool_call("report", {}, id="r"))
    )
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("go"))).wait()).status == "done"
    [result] = await tool_results(harness, root.id)
    assert result.is_error and result.details is None
    assert message in result.text()
    assert not harness.session.failed
    await harness.close()


async def test_running_details_that_are_not_strict_json_raise_at_the_tools_call() -> None:
    raised: list[str] = []

    @tool
    async def progress(api: ToolApi) -> str:
        """Progress."""
        try:
            await api.details({"when": (1, 2)})
        except StrictJsonError as exc:
            raised.append(str(exc))
        await api.details({"step": "caf\udce9"})  # outside text in details is cleaned
        return "ok"

    harness, _ = await open_harness(
        tools=[progress], responder=call_then_answer(faux_tool_call("progress", {}, id="p"))
    )
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("go"))).wait()).status == "done"
    assert raised == ["details of tool progress.when: tuple is not JSON (use a list)"]
    [result] = await tool_results(harness, root.id)
    assert result.details == {"step": "caf\ufffd"} and not result.is_error
    await harness.close()


# --- preparing a commit is never uncertain -------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "jsonl", "memory"])
async def test_a_backend_refusing_a_commit_while_serializing_does_not_close_the_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    # Let a bad value past the harness's own checks, as a bug or a new record field might: the backend must
    # refuse it while preparing (certain, nothing written), and the harness must stay up.
    import harness_core._tx as tx_module

    monkeypatch.setattr(tx_module, "check_record", lambda *args, **kwargs: None)
    storages: dict[str, Any] = {
        "sqlite": lambda: SqliteStorage.open(tmp_path / "s.sqlite"),
        "jsonl": lambda: JsonlStorage.open(tmp_path / "j"),
        "memory": MemoryStorage.open,
    }
    harness, _ = await open_harness(storage=await storages[backend]())
    root = await harness.root()
    bad = EntryDraft(kind="app.note", model=[UserMessage(content="broken \ud83d")])

    def append(tx: Any) -> int:
        return int(tx.append_entry(root.id, bad).id)

    if backend == "memory":  # memory keeps any str: stored and read back equal is the other allowed outcome
        entry = await harness.entry(await harness.commit(append))
        assert entry is not None and entry.model == bad.model
    else:
        with pytest.raises(StrictJsonError, match="refused a commit before writing it"):
            await harness.commit(append)
    assert not harness.session.failed
    after = await root.submit(Write(EntryDraft(kind="app.note", data="after")))
    assert (await after.wait()).status == "done"
    await harness.close()


# --- error texts quote outside text: they are made valid, so the failure itself is always storable -----------


async def test_an_exception_quoting_a_surrogate_still_ends_as_a_stored_error(tmp_path: Path) -> None:
    @tool
    def parse(text: str) -> str:
        """Parse."""
        raise ValueError(f"cannot parse {text}\udc00")

    async def explode(_task: Any, _runtime: Any) -> None:
        raise RuntimeError("bad \ud83d state")

    boom = define_task("app.boom", phases={"start": explode})
    respond = call_then_answer(faux_tool_call("parse", {"text": "x"}, id="p"))
    harness, _ = await open_harness(
        storage=await _sqlite(tmp_path),
        tools=[parse],
        extensions=[Extension("app", tasks=[boom])],
        responder=respond,
    )
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("go"))).wait()).status == "done"
    [result] = await tool_results(harness, root.id)
    assert result.is_error and "ValueError: cannot parse x\ufffd" in result.text()

    async def create(tx: Any) -> int:
        return int((await harness.create_task_in(tx, "app.boom", None, conversation_id=root.id)).id)

    task = await task_reaches(harness, await harness.commit(create), "terminal")
    assert task.state.outcome.status == "faulted"
    assert task.state.outcome.error.message == "RuntimeError: bad \ufffd state"
    assert not harness.session.failed
    await harness.close()
