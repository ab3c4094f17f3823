"""The task engine (DESIGN.md §2.6): phases, faults, waits, ownership, abort, holds, timers, memos, blocked
tasks, open-time reconciliation, the restart limit and parking."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from harness_core import (
    Aborted,
    Checkpoint,
    Complete,
    Extension,
    Fail,
    Harness,
    HarnessSettings,
    Ownerless,
    Registry,
    Task,
    TaskOwned,
    TaskRuntime,
    Tx,
    Wait,
    define_task,
)
from harness_core.records import Conversation, TaskState
from harness_core.storage import CommitBatch, MemoryStorage, SqliteStorage

from .helpers import task_reaches

log: list[str] = []


async def two_phases_first(task: Task, runtime: TaskRuntime) -> None:
    log.append(f"{task.id}:first")
    await runtime.commit(lambda _tx, _t: Checkpoint({"phase": "second", "n": 1}))


async def two_phases_second(task: Task, runtime: TaskRuntime) -> None:
    log.append(f"{task.id}:second:{task.state.checkpoint['n']}")
    await runtime.commit(lambda _tx, _t: Complete({"done": True}))


TwoPhase = define_task("test.two-phase", phases={"first": two_phases_first, "second": two_phases_second})


async def lazy(_task: Task, _runtime: TaskRuntime) -> None:
    return None


async def explode(_task: Task, _runtime: TaskRuntime) -> None:
    raise RuntimeError("boom")


Lazy = define_task("test.lazy", phases={"start": lazy})
Explode = define_task("test.explode", phases={"start": explode})


async def child_run(task: Task, runtime: TaskRuntime) -> None:
    behaviour = task.input["behaviour"]
    if behaviour == "fail":
        await runtime.commit(lambda _tx, _t: Fail("child failed"))
    elif behaviour == "slow":
        await asyncio.sleep(30)
    else:
        await runtime.commit(lambda _tx, _t: Complete(task.input.get("value")))


async def child_abort(task: Task, runtime: TaskRuntime) -> None:
    log.append(f"abort:{task.input.get('name', task.id)}")
    await runtime.commit(lambda _tx, _t: Aborted(reason=task.abort_reason))


Child = define_task("test.child", phases={"run": child_run}, abort=child_abort)


async def parent_spawn(task: Task, runtime: TaskRuntime) -> None:
    harness = runtime.harness
    behaviours = task.input["children"]

    async def spawn(tx: Tx, t: Task) -> Wait:
        ids = []
        for index, behaviour in enumerate(behaviours):
            child = await harness.create_task_in(
                tx,
                "test.child",
                {"behaviour": behaviour, "value": index, "name": f"c{index}"},
                owner_task_id=t.id,
            )
            ids.append(child.id)
        return Wait(
            checkpoint={"phase": "collect", "children": ids},
            on=ids,
            policy=task.input.get("policy", "all_settled"),
        )

    await runtime.commit(spawn)


async def parent_collect(task: Task, runtime: TaskRuntime) -> None:
    outcomes = await runtime.outcomes(task.state.checkpoint["children"])
    await runtime.commit(lambda _tx, _t: Complete([o.status for o in outcomes]))


async def parent_abort(task: Task, runtime: TaskRuntime) -> None:
    log.append("abort:parent")
    await runtime.commit(lambda _tx, _t: Aborted(reason=task.abort_reason))


Parent = define_task(
    "test.parent", phases={"spawn": parent_spawn, "collect": parent_collect}, abort=parent_abort
)


async def sleeper_start(task: Task, runtime: TaskRuntime) -> None:
    until = runtime.now() + task.input["ms"]
    await runtime.commit(lambda _tx, _t: Wait(checkpoint={"phase": "fire", "until": until}, deadline=until))


async def sleeper_fire(task: Task, runtime: TaskRuntime) -> None:
    log.append(f"fired:{task.id}")
    await runtime.commit(lambda _tx, _t: Complete(runtime.now() >= task.state.checkpoint["until"]))


Sleeper = define_task("test.sleeper", phases={"start": sleeper_start, "fire": sleeper_fire})


async def memo_start(task: Task, runtime: TaskRuntime) -> None:
    first, second = await asyncio.gather(runtime.memo("k", "a"), runtime.memo("k", "b"))
    again = await runtime.memo("k")
    await runtime.commit(lambda _tx, _t: Complete([first, second, again]))


Memo = define_task("test.memo", phases={"start": memo_start})


async def holder_start(task: Task, runtime: TaskRuntime) -> None:
    harness = runtime.harness

    async def own(tx: Tx, t: Task) -> Complete:
        child = await tx.create_conversation(TaskOwned(task_id=t.id))
        await harness.create_task_in(tx, "test.child", {"behaviour": "slow"}, conversation_id=child.id)
        return Complete("held")

    await runtime.commit(own)


Holder = define_task("test.holder", phases={"start": holder_start})

ALL = Extension("test-tasks", tasks=[TwoPhase, Lazy, Explode, Child, Parent, Sleeper, Memo, Holder])


async def open_with_tasks(
    storage: MemoryStorage | None = None,
    settings: HarnessSettings | None = None,
    reports: list[BaseException] | None = None,
) -> Harness:
    registry = Registry()
    registry.install(ALL)
    return await Harness.open(
        storage or await MemoryStorage.open(),
        registry=registry,
        settings=settings,
        on_report=reports.append if reports is not None else None,
    )


async def start(harness: Harness, kind: str, input: Any = None) -> int:
    root = await harness.root()

    async def create(tx: Tx) -> int:
        return (await harness.create_task_in(tx, kind, input, conversation_id=root.id)).id

    task_id = await harness.commit(create)
    harness.resume()
    return task_id


@pytest.fixture(autouse=True)
def clear_log() -> None:
    log.clear()


async def test_phases_checkpoint_and_complete() -> None:
    harness = await open_with_tasks()
    task_id = await start(harness, "test.two-phase")
    task = await harness.wait_for_task(task_id)
    assert task.state.outcome is not None and task.state.outcome.status == "completed"
    assert task.state.outcome.result == {"done": True}
    assert log == [f"{task_id}:first", f"{task_id}:second:1"]
    assert task.started_at is not None and task.ended_at is not None
    await harness.close()


async def test_phase_without_progress_faults() -> None:
    harness = await open_with_tasks()
    task = await harness.wait_for_task(await start(harness, "test.lazy"))
    assert task.state.outcome is not None and task.state.outcome.status == "faulted"
    assert "no durable progress" in (task.state.outcome.error.message if task.state.outcome.error else "")
    await harness.close()


async def test_exception_faults_the_task() -> None:
    harness = await open_with_tasks()
    task = await harness.wait_for_task(await start(harness, "test.explode"))
    assert task.state.outcome is not None and task.state.outcome.status == "faulted"
    assert task.state.outcome.error is not None and "boom" in task.state.outcome.error.message
    await harness.close()


async def test_wait_all_settled_collects_outcomes_in_order() -> None:
    harness = await open_with_tasks()
    task = await harness.wait_for_task(
        await start(harness, "test.parent", {"children": ["ok", "fail", "ok"]})
    )
    assert task.state.outcome is not None and task.state.outcome.result == [
        "completed",
        "failed",
        "completed",
    ]
    await harness.close()


async def test_fail_fast_aborts_the_siblings() -> None:
    harness = await open_with_tasks()
    task = await harness.wait_for_task(
        await start(harness, "test.parent", {"children": ["slow", "fail", "slow"], "policy": "fail_fast"})
    )
    assert task.state.outcome is not None and task.state.outcome.result == ["aborted", "failed", "aborted"]
    assert sorted(log) == ["abort:c0", "abort:c2"]
    await harness.close()


async def test_abort_runs_bottom_up() -> None:
    harness = await open_with_tasks()
    task_id = await start(harness, "test.parent", {"children": ["slow", "slow"]})

    await task_reaches(harness, task_id, "waiting")
    assert await harness.abort_task(task_id) == "marked"
    task = await harness.wait_for_task(task_id)
    assert task.state.outcome is not None and task.state.outcome.status == "aborted"
    assert log[-1] == "abort:parent"
    assert sorted(log[:-1]) == ["abort:c0", "abort:c1"]
    assert await harness.abort_task(task_id) == "terminal"
    await harness.close()


async def test_completing_hold_until_owned_conversation_work_drains() -> None:
    harness = await open_with_tasks()
    task_id = await start(harness, "test.holder")
    t = await task_reaches(harness, task_id, "completing")
    assert t is not None and t.state.outcome is not None and t.state.outcome.status == "completed"
    child_conversations = await harness.session.storage.scan_conversations(owner_task_id=task_id)
    child_tasks = [
        x
        for x in harness.session.published.live_tasks.values()
        if x.conversation_id == child_conversations.items[0].id
    ]
    assert len(child_tasks) == 1
    await harness.abort_task(child_tasks[0].id)
    final = await harness.wait_for_task(task_id)
    assert final.state.status == "terminal" and final.state.outcome is not None
    assert final.state.outcome.result == "held"
    await harness.close()


async def test_durable_deadline_wait_fires_once() -> None:
    harness = await open_with_tasks()
    task_id = await start(harness, "test.sleeper", {"ms": 50})
    t = await task_reaches(harness, task_id, "waiting")
    assert harness.next_deadline() == t.state.deadline
    task = await harness.wait_for_task(task_id)
    assert task.state.outcome is not None and task.state.outcome.result is True
    assert log == [f"fired:{task_id}"]
    assert harness.next_deadline() is None
    await harness.close()


async def test_memo_first_writer_wins_and_is_dropped_at_terminal() -> None:
    harness = await open_with_tasks()
    task = await harness.wait_for_task(await start(harness, "test.memo"))
    assert task.state.outcome is not None and task.state.outcome.result == ["a", "a", "a"]
    assert task.memos == {}
    await harness.close()


async def test_missing_definition_blocks_and_install_resumes() -> None:
    storage = await MemoryStorage.open()
    registry = Registry()  # test.two-phase is not installed
    harness = await Harness.open(storage, registry=registry)
    root = await harness.root()
    registry.install(ALL)

    async def create(tx: Tx) -> int:
        return (await harness.create_task_in(tx, "test.two-phase", conversation_id=root.id)).id

    task_id = await harness.commit(create)
    registry.uninstall("test-tasks")
    harness.resume()
    await asyncio.sleep(0.05)
    inspection = await harness.inspect()
    [entry] = [t for t in inspection.tasks if t.record.id == task_id]
    assert entry.state == "blocked" and entry.reason == "missing_task"
    registry.install(ALL)
    task = await harness.wait_for_task(task_id)
    assert task.state.outcome is not None and task.state.outcome.status == "completed"
    await harness.close()


async def test_aborting_a_blocked_task_orphans_it() -> None:
    registry = Registry()
    registry.install(ALL)
    harness = await Harness.open(await MemoryStorage.open(), registry=registry)
    root = await harness.root()

    async def create(tx: Tx) -> int:
        return (await harness.create_task_in(tx, "test.two-phase", conversation_id=root.id)).id

    task_id = await harness.commit(create)
    registry.uninstall("test-tasks")
    assert await harness.abort_task(task_id) == "marked"
    task = await harness.get_task(task_id)
    assert task is not None and task.state.outcome is not None
    assert task.state.outcome.status == "orphaned" and task.state.outcome.reason == "missing_task"
    await harness.close()


async def _seed_running_task(storage: MemoryStorage, restarts: int) -> int:
    """Write a store as a crashed process leaves it: a task recorded as running."""
    running = Task(
        id=10,
        conversation_id=1,
        kind="test.two-phase",
        state=TaskState(status="running", checkpoint={"phase": "first"}),
        restarts=restarts,
    )
    await storage.commit(
        [CommitBatch(seq=1, next_id=11, conversations=[Conversation(id=1)], tasks=[running])]
    )
    return running.id


async def test_open_reconciles_running_tasks_and_counts_restarts() -> None:
    storage = await MemoryStorage.open()
    task_id = await _seed_running_task(storage, restarts=0)
    harness = await open_with_tasks(storage)
    task = await harness.get_task(task_id)
    assert task is not None and task.state.status == "pending" and task.restarts == 1
    assert (await harness.inspect()).scheduling == "paused"
    done = await harness.wait_for_task(task_id)
    assert done.state.outcome is not None and done.state.outcome.status == "completed"
    assert done.restarts == 0  # committed progress resets the counter
    await harness.close()


async def test_restart_limit_parks_and_retry_runs_again() -> None:
    storage = await MemoryStorage.open()
    task_id = await _seed_running_task(storage, restarts=5)
    reports: list[BaseException] = []
    harness = await open_with_tasks(storage, reports=reports)
    task = await harness.get_task(task_id)
    assert task is not None and task.parked and task.restarts == 6
    assert any("parked" in str(r) for r in reports)
    harness.resume()
    await asyncio.sleep(0.05)
    assert (await harness.get_task(task_id)).state.status == "pending"  # type: ignore[union-attr]
    [parked] = (await harness.inspect()).parked()
    assert parked.record.id == task_id
    await harness.retry_task(task_id)
    done = await harness.wait_for_task(task_id)
    assert done.state.outcome is not None and done.state.outcome.status == "completed"
    await harness.close()


async def test_a_parked_task_that_is_cancelled_runs_its_abort_not_its_work() -> None:
    storage = await MemoryStorage.open()
    task_id = await _seed_running_task(storage, restarts=5)
    harness = await open_with_tasks(storage)
    harness.resume()
    assert (await harness.get_task(task_id)).parked  # type: ignore[union-attr]
    assert await harness.abort_task(task_id) == "marked"  # what `durable-bots cancel` does
    done = await asyncio.wait_for(harness.wait_for_task(task_id), 10)
    assert done.state.outcome is not None and done.state.outcome.status == "aborted"
    assert log == []  # neither phase ran again
    await harness.close()


async def test_an_abort_that_keeps_killing_its_process_is_parked_too() -> None:
    """The abort of a parked task gets a fresh restart count, not a pass: a store as a process leaves it after
    dying in the child's abort handler past the limit is parked again, and the handler does not run."""
    storage = await MemoryStorage.open()
    dying = Task(
        id=10,
        conversation_id=1,
        kind="test.child",
        input={"behaviour": "slow", "name": "c0"},
        state=TaskState(status="running", checkpoint={"phase": "run"}),
        restarts=5,
        abort_requested=True,
        abort_reason="aborted",
    )
    await storage.commit([CommitBatch(seq=1, next_id=11, conversations=[Conversation(id=1)], tasks=[dying])])
    harness = await open_with_tasks(storage)
    harness.resume()
    await asyncio.sleep(0.1)
    task = await harness.get_task(10)
    assert task is not None and task.parked and task.restarts == 6 and task.state.status == "pending"
    assert log == []  # its abort handler did not run again
    assert await harness.abort_task(10) == "marked"  # the operator cancels once more: a new budget
    done = await asyncio.wait_for(harness.wait_for_task(10), 10)
    assert done.state.outcome is not None and done.state.outcome.status == "aborted"
    assert log == ["abort:c0"]
    await harness.close()


async def test_graceful_close_joins_and_writes_no_outcome(tmp_path: Path) -> None:
    registry = Registry()
    registry.install(ALL)
    harness = await Harness.open(await SqliteStorage.open(tmp_path / "c.sqlite"), registry=registry)
    root = await harness.root()

    async def create(tx: Tx) -> int:
        return (
            await harness.create_task_in(tx, "test.child", {"behaviour": "slow"}, conversation_id=root.id)
        ).id

    task_id = await harness.commit(create)
    harness.resume()
    await task_reaches(harness, task_id, "running")
    await harness.close()  # the slow phase is signalled and joined, not finished
    storage = await SqliteStorage.open(tmp_path / "c.sqlite")
    stored = await storage.task(task_id)
    await storage.close()
    assert stored is not None and stored.state.status == "pending" and stored.restarts == 0


async def test_waits_refuse_self_and_owner() -> None:
    harness = await open_with_tasks()
    root = await harness.root()
    errors: list[str] = []

    async def bad_wait(task: Task, runtime: TaskRuntime) -> None:
        try:
            await runtime.commit(lambda _tx, t: Wait(checkpoint={"phase": "x"}, on=[t.id]))
        except Exception as exc:
            errors.append(str(exc))
        await runtime.commit(lambda _tx, _t: Complete())

    harness.registry.install(
        Extension("bad", tasks=[define_task("test.bad-wait", phases={"start": bad_wait})])
    )

    async def create(tx: Tx) -> int:
        return (await harness.create_task_in(tx, "test.bad-wait", conversation_id=root.id)).id

    await harness.wait_for_task(await harness.commit(create))
    assert errors and "itself" in errors[0]
    await harness.close()


async def test_owner_must_be_live() -> None:
    harness = await open_with_tasks()
    task_id = await start(harness, "test.two-phase")
    await harness.wait_for_task(task_id)
    from harness_core import InvalidOperation

    with pytest.raises(InvalidOperation, match="terminal"):
        await harness.commit(lambda tx: tx.create_conversation(TaskOwned(task_id=task_id)))
    await harness.commit(lambda tx: tx.create_conversation(Ownerless()))
    await harness.close()


async def test_task_migration_at_reservation(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    storage = await SqliteStorage.open(path)
    old = define_task("test.versioned", phases={"go": two_phases_second})
    registry = Registry()
    registry.install(Extension("v", tasks=[old]))
    harness = await Harness.open(storage, registry=registry)
    root = await harness.root()

    async def create(tx: Tx) -> int:
        return (await harness.create_task_in(tx, "test.versioned", conversation_id=root.id)).id

    task_id = await harness.commit(create)
    await harness.close()

    async def go(task: Task, runtime: TaskRuntime) -> None:
        await runtime.commit(lambda _tx, _t: Complete({"input": task.input, "cp": task.state.checkpoint}))

    new = define_task(
        "test.versioned",
        version=2,
        phases={"go": go},
        migrate=lambda input, checkpoint, _v: ({"migrated": True}, {**checkpoint, "n": 2}),
    )
    registry = Registry()
    registry.install(Extension("v", tasks=[new]))
    harness = await Harness.open(await SqliteStorage.open(path), registry=registry)
    task = await harness.wait_for_task(task_id)
    assert task.version == 2
    assert task.state.outcome is not None and task.state.outcome.result == {
        "input": {"migrated": True},
        "cp": {"phase": "go", "n": 2},
    }
    await harness.close()


async def test_a_wake_that_races_ahead_of_the_wait_is_kept() -> None:
    """An event (e.g. an approval click) committed while the task is still running, before it starts its
    durable wait: the wait must resume at once instead of sleeping until its deadline."""
    harness = await open_with_tasks()
    root = await harness.root()
    ready = asyncio.Event()
    woke = asyncio.Event()

    async def prepare(task: Task, runtime: TaskRuntime) -> None:
        ready.set()
        await woke.wait()  # the wake is committed now, while we are still running
        far = runtime.now() + 3_600_000
        await runtime.commit(lambda _tx, _t: Wait(checkpoint={"phase": "after"}, deadline=far))

    async def after(task: Task, runtime: TaskRuntime) -> None:
        await runtime.commit(lambda _tx, _t: Complete("resumed"))

    harness.registry.install(
        Extension("race", tasks=[define_task("test.race", phases={"prepare": prepare, "after": after})])
    )

    async def create(tx: Tx) -> int:
        return (await harness.create_task_in(tx, "test.race", conversation_id=root.id)).id

    task_id = await harness.commit(create)
    harness.resume()
    await ready.wait()
    assert await harness.commit(lambda tx: harness.wake_task(tx, task_id))
    woke.set()
    done = await asyncio.wait_for(harness.wait_for_task(task_id), 5)
    assert done.state.outcome is not None and done.state.outcome.result == "resumed"
    await harness.close()


async def test_a_wake_does_not_cut_short_a_wait_on_tasks() -> None:
    harness = await open_with_tasks()
    task_id = await start(harness, "test.parent", {"children": ["slow"]})
    await task_reaches(harness, task_id, "waiting")
    assert await harness.commit(lambda tx: harness.wake_task(tx, task_id))
    await asyncio.sleep(0.05)
    assert (await harness.get_task(task_id)).state.status == "waiting"  # type: ignore[union-attr]
    await harness.close()


async def hold_until_woken(_task: Task, runtime: TaskRuntime) -> None:
    later = runtime.now() + 3_600_000  # holds for an hour unless aborted
    await runtime.commit(lambda _tx, _t: Wait(checkpoint={"phase": "done"}, deadline=later))


async def finish(_task: Task, runtime: TaskRuntime) -> None:
    await runtime.commit(lambda _tx, _t: Complete("finished"))


Holder = define_task("test.holder", phases={"hold": hold_until_woken, "done": finish})


async def test_background_tasks_are_boundaries_for_idle_and_abort() -> None:
    registry = Registry()
    registry.install(Extension("holder", tasks=[Holder]))
    harness = await Harness.open(await MemoryStorage.open(), registry=registry)
    root = await harness.root()

    async def create(tx: Tx) -> tuple[int, int]:
        chore = await harness.create_task_in(tx, "test.holder", conversation_id=root.id, background=True)
        work = await harness.create_task_in(tx, "test.holder", conversation_id=root.id)
        return chore.id, work.id

    chore, work = await harness.commit(create)
    harness.resume()
    await task_reaches(harness, chore, "waiting")
    await task_reaches(harness, work, "waiting")
    idle = asyncio.ensure_future(root.wait_for_idle())
    await asyncio.sleep(0.05)
    assert not idle.done()  # the ordinary task keeps the conversation busy

    await root.abort()  # aborts the conversation's ordinary work only
    await asyncio.wait_for(idle, 5)  # idle although the background task is still live
    assert (await harness.get_task(work)).state.outcome.status == "aborted"  # type: ignore[union-attr]
    background = await harness.get_task(chore)
    assert background is not None and background.state.status == "waiting" and not background.abort_requested

    await root.abort(background=True)  # asked for explicitly, it goes too
    assert (await harness.get_task(chore)).state.outcome.status == "aborted"  # type: ignore[union-attr]
    await harness.close()


async def test_ended_tasks_are_served_from_memory_only_as_stored(tmp_path: Path) -> None:
    path = tmp_path / "ended.sqlite"
    harness = await open_with_tasks(await SqliteStorage.open(path))  # type: ignore[arg-type]
    task_id = await start(harness, "test.two-phase")
    ended = await harness.wait_for_task(task_id)
    assert harness.session.published.ended.get(task_id) == (True, ended)

    async def rewrite(tx: Tx, reason: str, fail: bool) -> None:
        current = await tx.task(task_id)
        assert current is not None
        tx.put_task(current.model_copy(update={"abort_reason": reason}))
        if fail:
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        await harness.commit(lambda tx: rewrite(tx, "never stored", True))
    found = await harness.get_task(task_id)
    assert found is not None and found.abort_reason is None  # a rolled-back write is not cached
    await harness.commit(lambda tx: rewrite(tx, "rewritten", False))
    found = await harness.get_task(task_id)
    assert found is not None and found.abort_reason == "rewritten"  # the commit replaced the cached record
    assert found == await harness.session.storage.task(task_id)
    await harness.close()

    reopened = await open_with_tasks(await SqliteStorage.open(path))  # type: ignore[arg-type]
    found = await reopened.get_task(task_id)
    assert found is not None and found.abort_reason == "rewritten"
    await reopened.close()


def test_the_ended_task_cache_is_bounded() -> None:
    from harness_core._layers import Layer, Published
    from harness_core.records import Outcome

    published = Published(ended_capacity=2)
    for task_id in (1, 2, 3):
        layer = Layer()
        layer.put_task(
            Task(
                id=task_id,
                conversation_id=1,
                kind="test.lazy",
                state=TaskState(status="terminal", outcome=Outcome(status="completed")),
            )
        )
        published.adopt(layer)
    assert len(published.ended) == 2 and published.ended.get(1) == (False, None)
