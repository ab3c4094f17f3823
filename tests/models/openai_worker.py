"""A bot process for `test_harness_sigkill.py`: a harness on SQLite with `OpenAIProvider` pointed at a local
test server and one tool that appends to a ledger file. It submits one input (a fixed request id, so a restarted
worker finds the same submission), waits for it to settle, and reports on stdout as JSON lines:

    {"event": "submitted", "id": ...}              after the submission is committed
    {"event": "partial", "text": ...}              each committed streaming partial (from the publication feed,
                                                   so the text is durable when it is printed)
    {"event": "settled", "status": ..., ...}       when the submission settled; then the process exits 0

Usage: python openai_worker.py BASE_URL DB_PATH LEDGER_PATH REQUEST_ID
The test server finds the process to kill through the `x-worker-pid` header on every request.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from harness_core import (
    AgentChange,
    Extension,
    Harness,
    HarnessSettings,
    Input,
    ModelRef,
    Models,
    ProgressSettings,
    Publication,
    Registry,
    tool,
)
from harness_core.messages import AssistantMessage
from harness_core.models.openai import OpenAIProvider
from harness_core.storage import SqliteStorage

MODEL = ModelRef(provider="openai", model_id="e2e-model")
QUESTION = "Weather in Zürich and Oslo?"


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}, ensure_ascii=False) + "\n")
    sys.stdout.flush()


async def main(base_url: str, db_path: str, ledger: str, request_id: str) -> None:
    @tool
    def forecast(city: str, days: int) -> str:
        """The weather forecast for a city."""
        with open(ledger, "a", encoding="utf-8") as out:
            out.write(json.dumps({"pid": os.getpid(), "city": city, "days": days}, ensure_ascii=False) + "\n")
        return f"{city}: sunny for {days} days"

    provider = OpenAIProvider(api_key="test", base_url=base_url, headers={"x-worker-pid": str(os.getpid())})
    registry = Registry()
    registry.install(Extension("weather", tools=[forecast]))
    settings = HarnessSettings(progress=ProgressSettings(partial_interval_ms=20))
    storage = await SqliteStorage.open(db_path)
    harness = await Harness.open(storage, models=Models(provider), registry=registry, settings=settings)

    def on_publication(publication: Publication) -> None:
        for doc in publication.docs:
            if doc.record.kind != "core.live" or not doc.value:
                continue
            message = (doc.value.get("generation") or {}).get("message")
            if message is not None:
                emit("partial", text=AssistantMessage.model_validate(message).text())

    harness.add_publication_listener(on_publication)
    root = await harness.root(agent=AgentChange(model=MODEL))
    submission = await root.submit(Input(QUESTION, request_id=request_id))
    emit("submitted", id=submission.id)
    settled = await submission.wait()
    emit(
        "settled",
        id=settled.id,
        status=settled.status,
        answer=settled.answer,
        reason=settled.reason,
        detail=settled.detail,
    )
    await harness.close()
    await provider.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
