"""`LiveView` lookups over the published indexes and the per-layer indexes of a commit group: a task written
in a layer is found by owner, conversation and awaited task, and a later version of it in the same or a newer
layer decides (no stale match from an index that only ever grows)."""

from __future__ import annotations

from harness_core._layers import Layer, Published
from harness_core._reconcile import LiveView
from harness_core.records import Outcome, Task, TaskState


def _task(task_id: int, *, owner: int | None = None, conversation: int = 1, state: TaskState) -> Task:
    return Task(id=task_id, conversation_id=conversation, kind="test.t", owner_task_id=owner, state=state)


RUNNING = TaskState(status="running", checkpoint={"phase": "a"})
DONE = TaskState(status="terminal", outcome=Outcome(status="completed"))


def test_layer_writes_are_found_and_later_versions_decide() -> None:
    published = Published()
    published.load_tasks({10: _task(10, state=RUNNING), 11: _task(11, owner=10, state=RUNNING)})
    overlay, local = Layer(), Layer()
    view = LiveView(published, (local, overlay))

    overlay.put_task(_task(12, owner=10, conversation=2, state=RUNNING))
    overlay.put_task(
        _task(13, conversation=2, state=TaskState(status="waiting", checkpoint={"phase": "w"}, on=[11]))
    )
    assert [t.id for t in view.children(10)] == [11, 12]
    assert [t.id for t in view.in_conversation(2)] == [12, 13]
    assert [t.id for t in view.waiters_of(11)] == [13]

    # Newer versions in the commit's own layer: 12 ended, 13 stopped waiting, 11 ended.
    local.put_task(_task(12, owner=10, conversation=2, state=DONE))
    local.put_task(_task(13, conversation=2, state=RUNNING))
    local.put_task(_task(11, owner=10, state=DONE))
    assert view.children(10) == []
    assert [t.id for t in view.in_conversation(2)] == [13]
    assert view.waiters_of(11) == []

    # Within one layer too: a task re-put no longer waiting is not a waiter.
    overlay.merge(local)
    alone = LiveView(published, (overlay,))
    assert alone.waiters_of(11) == []
    assert [t.id for t in alone.in_conversation(1)] == [10]


def test_published_waiters_are_overridden_by_layers() -> None:
    published = Published()
    published.load_tasks(
        {
            1: _task(1, state=RUNNING),
            2: _task(2, state=TaskState(status="waiting", checkpoint={"phase": "w"}, on=[1])),
        }
    )
    layer = Layer()
    view = LiveView(published, (layer,))
    assert [t.id for t in view.waiters_of(1)] == [2]
    layer.put_task(_task(2, state=TaskState(status="pending", checkpoint={"phase": "w"})))
    assert view.waiters_of(1) == []
