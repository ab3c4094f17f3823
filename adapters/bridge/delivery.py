"""Delivery, exactly once as far as the platform allows.

Each answered input has a reply record (`bridge.reply`, created with the input). Per message part the worker
commits the intent (a key) before posting, posts with that key where the platform can echo it back, then
records the platform message id. After a crash between posting and recording, `Transport.find` locates the
message by its key before anything is posted again. While the model streams, the message is edited; the
final render edits the same message(s) and retires the record.

Pacing: every write (post, continuation post, streaming edit, final edit, and the approval cards of
`approvals.py`) goes through the platform's rate governor under one key per channel, so all reply workers
writing into a channel share one budget of one write per `transport.edit_interval`, and a Retry-After pushes
that channel's next write out. Other channels go on.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from adapters.bridge.docs import ApprovalDoc, DeliveredDoc, MessageDoc, PlaceDoc, ReplyDoc
from adapters.bridge.model import DeleteRefused, EditExpired, MessageGone, Place, RetryLater, TransportError
from adapters.bridge.text import (
    QUEUED,
    WAITING_BEHIND_HOLD,
    incident_id,
    is_internal,
    is_status_only,
    render_partial,
    render_unanswered,
    split_text,
)
from harness_core import Entry, Harness, LiveDoc, Tx, log_context
from harness_core.messages import AssistantMessage, ToolResultMessage

if TYPE_CHECKING:
    from adapters.bridge.bridge import Bridge
    from adapters.bridge.transport import Transport

log = logging.getLogger("adapters.bridge")


REPLY_KEY_PREFIX = "reply:"
STALE_DELETE_TRIES = 3  # a rate-limited delete of an outdated status message is tried this often
REMOVED_TEXT = "\u2800"  # Braille blank: shows nothing, yet every platform takes it as a non-empty text


def is_reply_key(key: str) -> bool:
    """Whether a delivery key names a part of an answer (as opposed to an approval request message)."""
    return key.startswith(REPLY_KEY_PREFIX)


def answer_text(message: Any) -> str:
    if isinstance(message, AssistantMessage):
        return message.text() or "(no text)"
    return "(no text)"


async def gated_explanation(
    harness: Harness, conversation_id: int, input_entry: int | None, answer: Entry | None
) -> str:
    """What the model said before a call that now waits for approval, in the run that asked for it.

    The final answer replaces what the reply showed while it streamed; for a gated call that explanation ("the
    logs show X; deploying the fix") is the why of the approval card, so it stays visible above the answer."""
    if input_entry is None or answer is None:
        return ""
    handle = await harness.conversation(conversation_id)
    if handle is None:
        return ""
    run: list[Entry] = []
    page = await handle.entries(limit=50)
    for item in page.items:  # newest first: the answer, the run's entries, then the input
        if item.id <= input_entry:
            break
        if item.id <= answer.id:
            run.append(item)
    gated = False
    texts: list[str] = []
    for item in reversed(run):
        for message in item.model or ():
            if isinstance(message, ToolResultMessage) and isinstance(message.details, dict):
                gated = gated or "gate" in message.details
            elif isinstance(message, AssistantMessage) and item.id != answer.id and message.text().strip():
                texts.append(message.text().strip())
    return "\n\n".join(texts) if gated else ""


def pacing_key(target: Place) -> str:
    """The rate budget a write into `target` counts against: its channel. Slack limits posts and updates per
    channel (a thread's replies count against their channel); Discord's send/edit bucket is per channel, and a
    thread is a channel of its own there, so pacing it together with its parent is only stricter."""
    return f"channel:{target.workspace}:{target.channel}"


class ReplyWorker:
    """Drives one reply from first partial to final render. Owned and joined by `Delivery`."""

    def __init__(self, bridge: Bridge, key: str) -> None:
        self.bridge = bridge
        self.key = key
        self.changed = asyncio.Event()
        self.changed.set()
        self.fresh: set[str] = set()  # part keys whose intent this process wrote (nothing posted yet)
        self.busy = False  # inside a step: a post or edit may be under way

    async def run(self) -> None:
        while not self.bridge.delivery.stopping:
            await self.changed.wait()
            self.changed.clear()
            self.busy = True
            try:
                if await self.step():
                    return
            except RetryLater as exc:
                await asyncio.sleep(exc.seconds)
                self.changed.set()
            except TransportError as exc:
                log.warning("reply %s: platform error, retrying: %s", self.key, exc)
                await asyncio.sleep(1.0)
                self.changed.set()
            finally:
                self.busy = False

    async def step(self) -> bool:
        """Show the current state; True when the reply is final and retired."""
        harness = self.bridge.harness
        reply = await harness.snapshot(ReplyDoc, key=self.key)
        if reply is None:
            return True
        target = Place.from_json(reply["target"])
        transport = self.bridge.transports.get(target.platform)
        if transport is None:
            return True  # another process (with that adapter) delivers it
        handle = await harness.submission(int(self.key))
        if handle is None:
            return True
        submission = handle.record
        final = submission.status in ("done", "unanswered")
        answer_entry: int | None = None
        if submission.status == "done":
            answer_entry = submission.answer
            delivered = await harness.snapshot(DeliveredDoc, key=str(answer_entry))
            if delivered and not reply.get("parts"):
                await self.finish(reply, target, None, [])  # a steer answered by another input's reply
                return True
            entry = await harness.entry(answer_entry or 0)
            text = answer_text(entry.model[0] if entry and entry.model else None)
            explanation = await gated_explanation(
                harness, submission.conversation_id, submission.entry, entry
            )
            if explanation and explanation not in text:
                text = f"{explanation}\n\n{text}"
        elif submission.status == "unanswered":
            if submission.reason == "aborted" and not reply.get("parts"):
                await self.finish(reply, target, None, [])  # withdrawn before anything was shown
                return True
            incident = None
            if is_internal(submission.reason):
                incident = incident_id(submission.id, submission.reason, submission.detail)
                log.error(
                    "incident %s: input %s in %s got no answer (%s): %s",
                    incident,
                    submission.id,
                    target.key,
                    submission.reason,
                    submission.detail,
                )
            text = render_unanswered(submission.reason, submission.detail, incident)
        else:
            live = await harness.snapshot(LiveDoc, int(reply["conversation_id"])) or {}
            run = live.get("run") or {}
            on_hold = await self.on_hold(live, int(reply["conversation_id"]))
            if not run.get("inputs") or int(run["inputs"][0]) != submission.id:
                if on_hold and run.get("inputs"):
                    # Behind a run that waits for an operator (maybe for days): the channel hears why.
                    text = WAITING_BEHIND_HOLD
                elif reply.get("parts"):
                    text = QUEUED  # it showed the hold, which an operator has retried since
                else:
                    return False  # queued behind another run: nothing to show yet
            else:
                pending = await self.pending_approval_tools(int(reply["conversation_id"]))
                text = render_partial(live, pending, on_hold)
        # A platform that escapes text counts the escaped length (optional `measure` on the transport).
        parts = split_text(text, transport.max_chars, getattr(transport, "measure", len))
        ids = await self.show(transport, target, reply, parts, final=final)
        if final:
            await self.finish(reply, target, answer_entry, ids)
            self.bridge.stats.answers_delivered[target.platform] += 1
            log.info("answer delivered in %s", target.key)
            return True
        return False

    async def on_hold(self, live: dict[str, Any], conversation_id: int) -> dict[int, int]:
        """The run's parked tasks (its generation task, its unfinished tool tasks) and their restart counts.
        Each is remembered, so that a `retry` of it shows at once."""
        ids = [(live.get("run") or {}).get("task_id")]
        ids += [slot.get("task_id") for slot in live.get("tools", []) if slot.get("status") != "done"]
        found: dict[int, int] = {}
        for task_id in ids:
            if isinstance(task_id, int):
                task = await self.bridge.harness.get_task(task_id)
                if task is not None and task.parked:
                    found[task_id] = task.restarts
                    self.bridge.delivery.on_hold[task_id] = conversation_id
        return found

    async def pending_approval_tools(self, conversation_id: int) -> list[str]:
        return [
            gate["tool"]
            for gate in self.bridge.approvals.pending_in(conversation_id)
            if gate.get("status") == "pending"
        ]

    async def show(
        self, transport: Transport, target: Place, reply: dict[str, Any], texts: list[str], *, final: bool
    ) -> list[str]:
        parts: list[dict[str, Any]] = list(reply.get("parts", []))
        if final and len(parts) > len(texts):
            parts = await self.remove_parts(transport, target, parts, keep=len(texts))
        ids: list[str] = []
        for index, text in enumerate(texts):
            if index >= len(parts):
                part_key = f"{REPLY_KEY_PREFIX}{self.key}#{index}"
                await self.record_part(index, {"key": part_key, "message_id": None})
                self.fresh.add(part_key)
                parts.append({"key": part_key, "message_id": None})
            part = parts[index]
            message_id = part.get("message_id")
            if message_id is None and part["key"] not in self.fresh:
                message_id = await transport.find(target, part["key"])
                if message_id is not None:
                    await self.record_part(index, {**part, "message_id": message_id})
            if message_id is None:
                async with self.pace(transport, target):
                    # From here the platform may hold the message even if we never hear back: reconcile first.
                    self.fresh.discard(part["key"])
                    message_id = await transport.create(
                        target, text, part["key"], final=final, requester=self.requester(reply)
                    )
                self.bridge.shown[message_id] = text
                # Whether it was posted showing only a status: what a later process knows of it (no commit
                # per edit records what it shows since).
                await self.record_part(
                    index, {**part, "message_id": message_id, "status": is_status_only(text)}
                )
            elif self.bridge.shown.get(message_id) != text:
                try:
                    # Final edits are paced too (they wait their turn, they are never skipped).
                    async with self.pace(transport, target):
                        await transport.edit(target, message_id, text, part["key"], final=final)
                except (MessageGone, EditExpired) as refused:
                    # Continue in a new message; the old one keeps what it showed, unless that was only a
                    # status (an on-hold notice, a wait), which would go on saying so: it is deleted. What it
                    # shows is known in the process that showed it, else by how it was posted (a message
                    # posted as a status that showed answer text since loses nothing: the new one has it all).
                    shown = self.bridge.shown.get(message_id)
                    status_only = is_status_only(shown) if shown is not None else bool(part.get("status"))
                    stale = message_id if isinstance(refused, EditExpired) and status_only else None
                    new_key = f"{part['key']}+"
                    await self.record_part(index, {"key": new_key, "message_id": None})
                    async with self.pace(transport, target):
                        message_id = await transport.create(
                            target, text, new_key, final=final, requester=self.requester(reply)
                        )
                    await self.record_part(
                        index, {"key": new_key, "message_id": message_id, "status": is_status_only(text)}
                    )
                    if stale is not None:
                        await self.delete_stale(transport, target, stale, part["key"])
                self.bridge.shown[message_id] = text
            ids.append(message_id)
        return ids

    async def delete_stale(self, transport: Transport, target: Place, message_id: str, key: str) -> None:
        """Delete a message that showed only a status and can no longer be edited. Best effort: its new part is
        recorded already, so this step does not come back for it; a crash before the delete, a platform that
        refuses it or keeps failing leaves it as it was."""
        self.bridge.shown.pop(message_id, None)
        for _ in range(STALE_DELETE_TRIES):
            try:
                async with self.pace(transport, target):
                    await transport.delete(target, message_id, key)
                return
            except RetryLater as exc:  # rate limited: wait as asked, then once more
                await asyncio.sleep(exc.seconds)
            except (DeleteRefused, MessageGone, TransportError) as exc:
                log.info("reply %s: an outdated status message %s stays (%s)", self.key, message_id, exc)
                return
        log.info("reply %s: an outdated status message %s stays (still rate limited)", self.key, message_id)

    async def remove_parts(
        self, transport: Transport, target: Place, parts: list[dict[str, Any]], *, keep: int
    ) -> list[dict[str, Any]]:
        """Delete the parts beyond the first `keep` (the final text is shorter than what was streamed, e.g. a
        long partial, then a tool call, then a short answer). The intent is committed first, so a crash between
        the deletes is finished by the next process: it deletes again, and a part already gone is no error."""
        extra = parts[keep:]
        if not all(part.get("remove") for part in extra):
            marked = [{**part, "remove": True} for part in extra]
            await self.record_parts(parts[:keep] + marked)
            extra = marked
        for part in extra:
            message_id = part.get("message_id")
            if message_id is None and part["key"] not in self.fresh:
                message_id = await transport.find(target, part["key"])
            self.fresh.discard(part["key"])
            if message_id is None:
                continue  # never posted
            async with self.pace(transport, target):
                try:
                    await transport.delete(target, message_id, part["key"])
                except DeleteRefused as exc:
                    log.info("reply %s: cannot delete %s (%s); blanking it", self.key, message_id, exc)
                    try:
                        await transport.edit(target, message_id, REMOVED_TEXT, part["key"], final=True)
                    except (MessageGone, EditExpired) as gone:
                        log.warning("reply %s: leftover part %s stays (%s)", self.key, message_id, gone)
            self.bridge.shown.pop(message_id, None)
        kept = parts[:keep]
        await self.record_parts(kept)
        return kept

    def pace(self, transport: Transport, target: Place) -> AbstractAsyncContextManager[None]:
        """The slot for one write into `target`'s channel, shared by every reply worker of this process."""
        return self.bridge.governor(target.platform).slot(
            pacing_key(target), interval=transport.edit_interval, guard=self.bridge.write_guard
        )

    @staticmethod
    def requester(reply: dict[str, Any]) -> str | None:
        user_id = (reply.get("requester") or {}).get("user_id")
        return None if user_id is None else str(user_id)

    async def record_part(self, index: int, part: dict[str, Any]) -> None:
        async def commit(tx: Tx) -> None:
            doc = await tx.doc(ReplyDoc, key=self.key, seed={})
            parts = list(doc.value.get("parts", []))
            if index < len(parts):
                parts[index] = part
            else:
                parts.append(part)
            doc.value["parts"] = parts

        await self.bridge.harness.commit(commit)

    async def record_parts(self, parts: list[dict[str, Any]]) -> None:
        async def commit(tx: Tx) -> None:
            doc = await tx.doc(ReplyDoc, key=self.key, seed={})
            doc.value["parts"] = parts

        await self.bridge.harness.commit(commit)

    async def finish(
        self, reply: dict[str, Any], target: Place, answer_entry: int | None, ids: list[str]
    ) -> None:
        conversation_id = int(reply["conversation_id"])
        source = reply.get("source")

        async def commit(tx: Tx) -> None:
            await tx.retire_doc(ReplyDoc, key=self.key)
            if answer_entry is None or not ids:
                return
            delivered = await tx.doc(DeliveredDoc, key=str(answer_entry), seed={})
            delivered.value = {"message_ids": ids, "target": target.to_json()}
            for message_id in ids:
                doc = await tx.doc(MessageDoc, key=target.message_key(message_id), seed={})
                doc.value = {"conversation_id": conversation_id, "entry_id": answer_entry}
            if target.thread is not None and source == target.thread:
                # Answered inside the thread of the asking message: a thread there shows this answer.
                asked = await tx.doc(MessageDoc, key=target.message_key(source), seed={})
                asked.value["thread_answer"] = answer_entry
                place = await tx.doc(PlaceDoc, key=target.key, seed={})
                place.value["engaged"] = True

        await self.bridge.harness.commit(commit)
        for part in reply.get("parts") or []:  # final: these messages are not edited again
            self.bridge.shown.pop(str(part.get("message_id")), None)
        for message_id in ids:
            self.bridge.shown.pop(message_id, None)


class Delivery:
    """Owns one worker per reply still to be shown; every worker is awaited or cancelled at stop()."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.active: set[str] = set()  # reply keys with a live record
        self.workers: dict[str, tuple[ReplyWorker, asyncio.Task[None]]] = {}
        # Live reply keys per conversation; a conversation leaves with its last live reply (no empty sets).
        self.by_conversation: dict[int, set[str]] = {}
        self._conversation_of: dict[str, int] = {}
        self.on_hold: dict[int, int] = {}  # parked tasks shown in a reply -> their conversation
        self.stopping = False

    def track(self, key: str, conversation_id: int | None) -> None:
        self.active.add(key)
        if conversation_id is not None:
            self.by_conversation.setdefault(conversation_id, set()).add(key)
            self._conversation_of[key] = conversation_id

    def untrack(self, key: str) -> None:
        self.active.discard(key)
        conversation_id = self._conversation_of.pop(key, None)
        if conversation_id is None:
            return
        keys = self.by_conversation.get(conversation_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_conversation[conversation_id]

    def kick(self, key: str) -> None:
        if self.stopping or key not in self.active:
            return
        existing = self.workers.get(key)
        if existing is not None and not existing[1].done():
            existing[0].changed.set()
            return
        worker = ReplyWorker(self.bridge, key)
        with log_context(submission=key):  # what the worker logs names the answer it delivers
            task = asyncio.get_running_loop().create_task(self._run(worker), name=f"bridge-reply-{key}")
        self.workers[key] = (worker, task)

    def kick_conversation(self, conversation_id: int) -> None:
        for key in list(self.by_conversation.get(conversation_id, ())):
            self.kick(key)

    async def _run(self, worker: ReplyWorker) -> None:
        try:
            await worker.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # keep the bridge alive; the record stays and is retried on the next kick
            log.exception("reply %s failed: %s", worker.key, exc)
        finally:
            current = self.workers.get(worker.key)
            if current is not None and current[0] is worker:
                del self.workers[worker.key]

    async def stop(self, grace: float = 5.0) -> None:
        """Stop delivering. A worker in the middle of a step (a post and its record) gets up to `grace`
        seconds to finish it, so a graceful shutdown does not leave half-recorded work; idle workers are
        cancelled at once. Anything unfinished is picked up by the next start."""
        self.stopping = True
        busy = [task for worker, task in self.workers.values() if worker.busy]
        for worker, task in list(self.workers.values()):
            if not worker.busy:
                task.cancel()
        if busy:
            await asyncio.wait(busy, timeout=grace)
        tasks = [task for _, task in self.workers.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def idle(self) -> None:
        """Wait until no reply worker is running (tests and graceful shutdown)."""
        while self.workers:
            await asyncio.gather(*(task for _, task in list(self.workers.values())), return_exceptions=True)


async def load_active(bridge: Bridge) -> list[str]:
    """Reply and approval records still alive in storage (work a previous process did not finish)."""
    keys: list[str] = []
    for key, value in (await bridge.harness.family(ReplyDoc)).items():
        bridge.delivery.track(key, int(value.get("conversation_id", 0)) or None)
        keys.append(key)
    for key, value in (await bridge.harness.family(ApprovalDoc)).items():
        bridge.approvals.track(key, value)
    return keys
