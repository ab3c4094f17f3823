"""What a reply shows for a task parked after repeated process deaths (the end-to-end path, with real kills and
`retry`, is in tests/bots/test_bots_operations.py)."""

from __future__ import annotations

from adapters.bridge.text import render_partial


def test_a_parked_answer_or_tool_call_says_so_in_the_chats_terms() -> None:
    live = {
        "run": {"task_id": 12, "inputs": [3]},
        "generation": {"message": {"content": [{"type": "text", "text": "Looking at the logs"}]}},
    }
    assert render_partial(live, [], {12: 6}).splitlines() == [
        "Looking at the logs …",
        "⚠️ The bot stopped 6 times in a row while writing this answer, so that is on hold until an operator "
        "retries it (task 12).",
    ]
    tools = {
        "run": {"task_id": 12, "inputs": [3]},
        "tools": [
            {"name": "search_logs", "task_id": 13, "status": "done"},
            {"name": "fragile", "task_id": 14, "status": "running"},
            {"name": "open_ticket", "task_id": 15, "status": "pending"},
        ],
    }
    assert render_partial(tools, [], {14: 2}).splitlines() == [
        "⚠️ The bot stopped 2 times in a row while running `fragile`, so that is on hold until an operator "
        "retries it (task 14).",
        "⏳ `open_ticket` queued",
    ]
    assert "on hold" not in render_partial(tools, [])  # nothing parked: the usual status lines
