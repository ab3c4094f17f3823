"""The bridge's durable state: harness documents, written in the same commits as the work they describe."""

from __future__ import annotations

from harness_core import define_doc

PlaceDoc = define_doc("bridge.place", scope="session", family=True, initial=lambda seed: dict(seed or {}))
"""key: place key -> {conversation_id, place, last_seen}: the conversation of a channel or thread (a receipt, so
concurrent or replayed first messages create it once) and the newest message seen there."""

PlaceOfDoc = define_doc("bridge.place-of", initial=dict)
"""per conversation -> {place}: where answers of that conversation go."""

MessageDoc = define_doc("bridge.message", scope="session", family=True, initial=lambda seed: dict(seed or {}))
"""key: platform message key -> what it is in the harness: a user input {conversation_id, submission_id,
user_id, user_name} or a delivered answer {conversation_id, entry_id}; `thread_answer` is set when the bot
answered that message inside its thread (a thread started there forks at the answer)."""

ReplyDoc = define_doc("bridge.reply", scope="session", family=True, initial=lambda seed: dict(seed or {}))
"""key: submission id -> the delivery of its answer: {conversation_id, target, requester, parts:[{key,
message_id}], status}. Created with the input in the intake commit; retired once the final text is shown."""

DeliveredDoc = define_doc(
    "bridge.delivered", scope="session", family=True, initial=lambda seed: dict(seed or {})
)
"""key: answer entry id -> {message_ids, target}: answers already shown (several inputs can share one)."""

ApprovalDoc = define_doc(
    "bridge.approval", scope="session", family=True, initial=lambda seed: dict(seed or {})
)
"""key: tool task id -> an approval request: tool, arguments, requester, approvers, expiry, decision, message."""

ScheduleDoc = define_doc(
    "bridge.schedule", scope="session", family=True, initial=lambda seed: dict(seed or {})
)
"""key: tool task id -> {timer_task_id}: makes the `schedule` tool safe to run again after a crash."""

WatchDoc = define_doc("bridge.watch", scope="session", family=True, initial=lambda seed: dict(seed or {}))
"""key: `platform:workspace` -> {since_ms}: when this bot first watched that workspace. Catch-up of channels
that have no place yet never reaches back before it (a bot added to a busy workspace does not answer a day of
old mentions at its first start)."""
