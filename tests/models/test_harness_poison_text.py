"""Model output with unpaired UTF-16 surrogates, through the HTTP providers and the harness into a real SQLite
file (respx; no network). JSON allows `"\\ud83d"` on the wire; UTF-8 storage cannot hold it. Before the
boundary cleaned it, the commit failed inside SQLite, the harness closed, and every restart died the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness_core import CORE_ASSISTANT, Input
from harness_core.messages import AssistantMessage, ToolResultMessage
from harness_core.storage import SqliteStorage

from .harness_support import Call, Dialect, OpenRig, Script, stream_response

pytestmark = pytest.mark.timeout(15)


class EscapedCall(Call):
    """A call whose argument text carries the surrogate as a JSON escape (`\\ud83d`), not as a character."""

    @property
    def raw(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=True)


@pytest.mark.parametrize("escaped", [False, True], ids=["character", "escape"])
async def test_surrogates_in_text_and_tool_arguments_are_answered_once_and_a_restart_is_clean(
    dialect: Dialect, script: Script, open_rig: OpenRig, tmp_path: Path, escaped: bool
) -> None:
    path = tmp_path / "bot.sqlite"
    rig = await open_rig(storage=await SqliteStorage.open(path))
    make = EscapedCall if escaped else Call
    # A lone high surrogate, and a valid pair split into its two halves (3-character fragments cut it).
    call = make(dialect.call_ids[0], "forecast", {"city": "broken \ud83d city \ud83d\ude00", "days": 2})
    script.add(
        stream_response(dialect.tool_call_events([call], fragment=3)),
        # Text deltas: a lone surrogate, and a pair split across two events.
        stream_response(dialect.text_events("broken \ud83d emoji ", "\ud83d", "\ude00 done")),
    )
    submission = await rig.root.submit(Input("Weather?", request_id="m-1"))
    settled = await submission.wait()

    assert settled.status == "done"
    assert await rig.answer_text(settled.answer) == "broken \ufffd emoji \U0001f600 done"
    # The tool ran once, with the lone surrogate made U+FFFD and the split pair joined.
    assert rig.executed == [{"city": "broken \ufffd city \U0001f600", "days": 2}]
    assert len(script.requests) == 2
    assert not rig.harness.session.failed
    entries = await rig.all_entries()
    assistants = [e for e in entries if e.kind == CORE_ASSISTANT]
    assert len(assistants) == 2  # the tool round and the one answer
    first = assistants[0].model
    assert first is not None and isinstance(first[0], AssistantMessage)
    assert first[0].tool_calls()[0].arguments == {"city": "broken \ufffd city \U0001f600", "days": 2}
    results = [m for e in entries for m in e.model or () if isinstance(m, ToolResultMessage)]
    assert [r.text() for r in results] == ["broken \ufffd city \U0001f600: sunny for 2 days"]
    await rig.harness.close()

    # A restart reads everything back and has nothing left to do: no model request, no second answer.
    again = await open_rig(storage=await SqliteStorage.open(path))
    restored = await again.harness.submission(submission.id)
    assert restored is not None and (await restored.wait()).status == "done"
    assert (await again.root.submit(Input("Weather?", request_id="m-1"))).id == submission.id
    assert len(script.requests) == 2
    assert [e.id for e in await again.all_entries()] == [e.id for e in entries]
    inspection = await again.harness.inspect()
    assert inspection.tasks == [] and inspection.submissions == []
