"""`Tx`: what a commit callback gets. Reads see the callback's own writes, then earlier commits of the same
group, then durable state; writes are collected and stored atomically when the callback returns."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from harness_core._ancestry import ancestry, visible_in
from harness_core._json import WRAPPED_DEPTH, check_json, check_record, check_text, strict_copy
from harness_core._jsondiff import copy_and_diff
from harness_core._layers import DocState, Layer
from harness_core.documents import DocAddress, DocDefinition, DocDraft, address_of, migrated
from harness_core.errors import DraftRevoked, InvalidOperation, NotFound
from harness_core.messages import Message
from harness_core.records import (
    Conversation,
    DocumentContent,
    DocumentRecord,
    Entry,
    EntryDraft,
    Ownerless,
    Ownership,
    ParentRef,
    Submission,
    Task,
    TaskOwned,
)
from harness_core.storage._protocol import CommitBatch, DocChange, DocCreate

if TYPE_CHECKING:
    from harness_core._session import Publication, Session, TaskScope


class Tx:
    def __init__(self, session: Session, overlay: Layer, *, seq: int, scope: TaskScope | None) -> None:
        self._session = session
        self._overlay = overlay
        self.local = Layer()
        self.seq = seq
        self.scope = scope
        self._revoked = False
        self._drafts: dict[DocAddress, DocDraft] = {}
        self._retired: dict[DocAddress, DocumentRecord] = {}  # retired in this tx (record as it was)
        self._entry_order: list[Entry] = []
        self._forks: list[tuple[Conversation, int]] = []  # (child, parent conversation id)
        self._copied_docs: list[DocAddress] = []  # documents a fork copied from its parent
        self._retired_drafts: list[DocDraft] = []  # drafts retired in this commit: content first, then retire
        self.internal: dict[str, Any] = {}  # scratch space for harness hooks within this commit
        self._by_request_read: dict[tuple[int, str], Submission | None] = {}  # storage answers, this commit
        self._ingress_finished: list[int] = []
        self._now: int | None = None

    @property
    def now(self) -> int:
        # One commit happens at one instant: every time it writes (a decision's time, and the time it reports
        # back) must be the same number, so the clock is read once per transaction.
        if self._now is None:
            self._now = self._session.now()
        return self._now

    def _check(self) -> None:
        if self._revoked:
            raise DraftRevoked("transaction used after its commit callback returned")

    def finish_ingress(self, record_id: int) -> None:
        """Mark ingress record `record_id` finished by this commit: it is finished exactly when what this commit
        takes in from it is stored. Only on storage that keeps ingress records (`finishes_ingress`)."""
        self._check()
        if not self._session.finishes_ingress:
            raise InvalidOperation("this storage keeps no ingress records to finish")
        self._ingress_finished.append(record_id)

    def revoke(self) -> None:
        self._revoked = True
        for draft in self._drafts.values():
            draft._revoke()

    def mint_id(self) -> int:
        return self._session.mint_id()

    # --- table reads (own writes first, then the group, then durable state) --------------------------------------

    async def conversation(self, conversation_id: int) -> Conversation | None:
        self._check()
        for layer in (self.local, self._overlay):
            found = layer.conversations.get(conversation_id)
            if found is not None:
                return found
        published = self._session.published.conversations
        hit, cached = published.get(conversation_id)
        if hit:
            return cached
        stored = await self._session.storage.conversation(conversation_id)
        if stored is not None:
            published.put(conversation_id, stored)  # safe: on the line, storage equals the published state
        return stored

    async def entry(self, entry_id: int) -> Entry | None:
        self._check()
        for layer in (self.local, self._overlay):
            found = layer.entries.get(entry_id)
            if found is not None:
                return found
        return await self._session.storage.entry(entry_id)

    async def task(self, task_id: int) -> Task | None:
        self._check()
        for layer in (self.local, self._overlay):
            found = layer.tasks.get(task_id)
            if found is not None:
                return found
        return await self._session.read_task(task_id)

    async def submission(self, submission_id: int) -> Submission | None:
        self._check()
        for layer in (self.local, self._overlay):
            found = layer.submissions.get(submission_id)
            if found is not None:
                return found
        known = self._session.published.open_submissions.get(submission_id)
        if known is not None:
            return known
        return await self._session.storage.submission(submission_id)

    async def submission_by_request(self, conversation_id: int, request_id: str) -> Submission | None:
        self._check()
        for layer in (self.local, self._overlay):
            found = layer.by_request.get((conversation_id, request_id))
            if found is not None:
                return layer.submissions[found]
        key = (conversation_id, request_id)
        if key not in self._by_request_read:  # asked twice in one commit (a caller's check, then admit's)
            self._by_request_read[key] = await self._session.storage.submission_by_request(
                conversation_id, request_id
            )
        return self._by_request_read[key]

    async def conversations_owned_by(self, task_id: int) -> list[Conversation]:
        self._check()
        ids: list[int] = []
        for layer in (self.local, self._overlay):
            ids.extend(layer.owned_conversations.get(task_id, []))
        published = self._session.published
        known = published.owned.get(task_id)
        if known is None:
            page = await self._session.storage.scan_conversations(owner_task_id=task_id, limit=1000)
            stored = [c for c in page.items if c.id not in ids]
            if task_id in published.live_tasks:  # on the line storage equals the published state
                published.owned[task_id] = [c.id for c in page.items]
        else:
            stored = [
                c for c in await _gather_conversations(self, known) if c is not None and c.id not in ids
            ]
        own = [c for c in (await _gather_conversations(self, ids)) if c is not None]
        return sorted([*stored, *own], key=lambda c: c.id)

    def live_view(self) -> Any:
        """The live tasks as this commit sees them, with indexes (see `_reconcile.LiveView`)."""
        from harness_core._reconcile import LiveView

        return LiveView(self._session.published, (self.local, self._overlay))

    def live_tasks(self) -> dict[int, Task]:
        """Every live task as this commit sees it (durable live tasks overridden by group and own writes)."""
        merged = dict(self._session.published.live_tasks)
        for layer in (self._overlay, self.local):
            for task in layer.tasks.values():
                if task.live:
                    merged[task.id] = task
                else:
                    merged.pop(task.id, None)
        return merged

    def written_tasks(self) -> dict[int, Task]:
        return self.local.tasks

    def written_submissions(self) -> dict[int, Submission]:
        return self.local.submissions

    def appended_entries(self) -> list[Entry]:
        return list(self._entry_order)

    async def ancestry(self, conversation_id: int) -> list[tuple[int, int | None]]:
        """[(conversation id, highest visible entry id or None)] from the conversation up to its root."""
        return await ancestry(conversation_id, self.conversation)

    async def entry_visible(self, conversation_id: int, entry_id: int) -> Entry | None:
        entry = await self.entry(entry_id)
        if entry is None:
            return None
        chain = await self.ancestry(conversation_id)
        return entry if visible_in(chain, entry.conversation_id, entry.id) is not None else None

    async def latest_entry(self, conversation_id: int) -> Entry | None:
        """The newest entry visible in the conversation (fork-aware), as this commit sees it."""
        for conv, cap in await self.ancestry(conversation_id):
            pending = [
                e
                for layer in (self.local, self._overlay)
                for e in layer.entries_by_conv.get(conv, [])
                if cap is None or e.id <= cap
            ]
            if pending:
                return max(pending, key=lambda e: e.id)
            page = await self._session.storage.scan_entries(conv, max_id=cap, order="desc", limit=1)
            if page.items:
                return page.items[0]
        return None

    async def latest_head(self, conversation_id: int, at_or_before: int | None = None) -> Entry | None:
        """The newest visible entry with a head marker (fork-aware)."""
        for conv, cap in await self.ancestry(conversation_id):
            limit = cap if at_or_before is None else (at_or_before if cap is None else min(cap, at_or_before))
            pending = [
                e
                for layer in (self.local, self._overlay)
                for e in layer.entries_by_conv.get(conv, [])
                if e.head is not None and (limit is None or e.id <= limit)
            ]
            if pending:
                return max(pending, key=lambda e: e.id)
            stored = await self._session.storage.latest_head(conv, at_or_before=limit)
            if stored is not None:
                return stored
        return None

    # --- table writes ----------------------------------------------------------------------------------------

    async def _check_owner(self, task_id: int) -> Task:
        owner = await self.task(task_id)
        if owner is None:
            raise NotFound(f"owner task {task_id} does not exist")
        status = owner.state.status
        if status in ("terminal", "completing") or owner.abort_requested:
            raise InvalidOperation(
                f"owner task {task_id} is {status}{' and abort-marked' if owner.abort_requested else ''}"
            )
        return owner

    async def create_conversation(
        self, ownership: Ownership | None = None, *, conversation_id: int | None = None
    ) -> Conversation:
        """Create a conversation. Ownership is explicit: `Ownerless()` or `TaskOwned(task_id)`."""
        self._check()
        ownership = ownership or Ownerless()
        owner_task: int | None = None
        owner_conv: int | None = None
        if isinstance(ownership, TaskOwned):
            owner = await self._check_owner(ownership.task_id)
            owner_task, owner_conv = owner.id, owner.conversation_id
        new_id = conversation_id if conversation_id is not None else self.mint_id()
        record = Conversation(
            id=new_id, owner_task_id=owner_task, owner_conversation_id=owner_conv, seq=self.seq
        )
        self.local.add_conversation(record)
        await self._session.run_creation_hooks(self, record)
        return record

    async def fork_conversation(
        self, parent_id: int, at: int, ownership: Ownership | None = None
    ) -> Conversation:
        """Create a conversation that sees `parent_id`'s entries up to and including entry `at`."""
        self._check()
        if await self.conversation(parent_id) is None:
            raise NotFound(f"conversation {parent_id} does not exist")
        if await self.entry_visible(parent_id, at) is None:
            raise NotFound(f"entry {at} is not visible in conversation {parent_id}")
        ownership = ownership or Ownerless()
        owner_task: int | None = None
        owner_conv: int | None = None
        if isinstance(ownership, TaskOwned):
            owner = await self._check_owner(ownership.task_id)
            owner_task, owner_conv = owner.id, owner.conversation_id
        record = Conversation(
            id=self.mint_id(),
            parent=ParentRef(conversation_id=parent_id, at=at),
            owner_task_id=owner_task,
            owner_conversation_id=owner_conv,
            seq=self.seq,
        )
        self.local.add_conversation(record)
        self._forks.append((record, parent_id))
        await self._copy_fork_documents(record, parent_id, at)
        await self._session.run_creation_hooks(self, record)
        return record

    async def _copy_fork_documents(self, child: Conversation, parent_id: int, at: int) -> None:
        stored = await self._session.storage.scan_documents(scope="conversation", scope_id=parent_id)
        addresses: dict[DocAddress, DocumentRecord] = {
            (r.kind, r.scope, r.scope_id, r.key): r for r in stored
        }
        for layer in (self._overlay, self.local):
            for address, layered in layer.docs.items():
                if address[1] == "conversation" and address[2] == parent_id:
                    if layered is None:
                        addresses.pop(address, None)
                    else:
                        addresses[address] = layered.record
        for address, draft in self._drafts.items():
            if address[1] == "conversation" and address[2] == parent_id:
                addresses[address] = draft.record
        entry = await self.entry(at)
        assert entry is not None
        durable = entry.seq <= self._session.last_seq
        for address, record in sorted(addresses.items(), key=lambda item: item[1].id):
            if record.fork == "initial":
                continue
            state: DocState | None
            if record.fork == "as_of" and durable:
                found = await self._session.storage.find_document(*address, at_seq=entry.seq)
                stored_value = (
                    None
                    if found is None
                    else await self._session.storage.document(found.id, at_seq=entry.seq)
                )
                state = (
                    None
                    if stored_value is None
                    else DocState(stored_value.record, stored_value.version, stored_value.value)
                )
            else:
                # `current`, or an as-of point not stored yet (same commit group): the latest value is the value at it.
                state = await self._doc_state(address)
                pending_draft = self._drafts.get(address)
                if (
                    pending_draft is not None
                    and record.fork == "current"
                    and not _same_json(pending_draft._final(), pending_draft.original)
                ):
                    raise InvalidOperation(
                        f"this commit changes {record.kind} of conversation {parent_id} and forks it; "
                        "the fork's copy would be ambiguous"
                    )
            if state is None:
                continue
            child_record = state.record.model_copy(
                update={
                    "id": self.mint_id(),
                    "scope_id": child.id,
                    "created_seq": self.seq,
                    "retired_seq": None,
                }
            )
            child_address: DocAddress = (address[0], "conversation", child.id, address[3])
            self.local.docs[child_address] = DocState(child_record, state.version, copy.deepcopy(state.value))
            self._copied_docs.append(child_address)

    def append_entry(self, conversation_id: int, draft: EntryDraft) -> Entry:
        """Append an entry. `by_task_id` is stamped when the commit runs for a task."""
        self._check()
        entry_id = self.mint_id()
        head = entry_id if draft.head == "self" else draft.head
        data = None if draft.data is None else strict_copy(draft.data, f"entry {draft.kind} data")
        entry = Entry(
            id=entry_id,
            conversation_id=conversation_id,
            kind=draft.kind,
            model=draft.model,
            data=data,
            head=head,
            edits=draft.edits,
            by_task_id=self.scope.task_id if self.scope else None,
            seq=self.seq,
        )
        self.local.add_entry(entry)
        self._entry_order.append(entry)
        return entry

    def append_messages(
        self, conversation_id: int, kind: str, messages: list[Message], **extra: Any
    ) -> Entry:
        return self.append_entry(conversation_id, EntryDraft(kind=kind, model=messages, **extra))

    def put_task(self, task: Task) -> Task:
        """Write a whole task record (harness internal: tasks change state through their runtime)."""
        self._check()
        if task.seq != self.seq:
            task = task.model_copy(update={"seq": self.seq})
        self.local.put_task(task)
        return task

    def put_submission(self, submission: Submission) -> Submission:
        self._check()
        if submission.seq != self.seq:
            submission = submission.model_copy(update={"seq": self.seq})
        self.local.put_submission(submission)
        return submission

    async def check_owner(self, task_id: int) -> Task:
        return await self._check_owner(task_id)

    # --- documents -------------------------------------------------------------------------------------------

    async def _doc_state(self, address: DocAddress) -> DocState | None:
        for layer in (self.local, self._overlay):
            if address in layer.docs:
                return layer.docs[address]
        published = self._session.published.docs
        hit, cached = published.get(address)
        if hit:
            return cached
        state: DocState | None = await self._session.read_doc_state(address)
        published.put(address, state)  # on the line storage equals the published state, so caching is safe
        return state

    async def doc(
        self, definition: DocDefinition, scope_id: int | None = None, key: str | None = None, seed: Any = None
    ) -> DocDraft:
        """Get or create a document draft. The only operation that creates documents."""
        self._check()
        address = address_of(definition, scope_id, key)
        existing = self._drafts.get(address)
        if existing is not None:
            return existing
        state = await self._doc_state(address)
        if (
            state is not None
            and state.record.scope == "conversation"
            and (state.record.history != definition.history or state.record.fork != definition.fork)
        ):
            raise InvalidOperation(
                f"document {definition.kind} is stored with history={state.record.history} fork={state.record.fork}, "
                f"the definition says history={definition.history} fork={definition.fork}"
            )
        if state is None:
            draft = self._new_draft(definition, address, seed)
        else:
            value = migrated(definition, state.version, state.value)
            draft = DocDraft(
                definition,
                state.record,
                strict_copy(value, definition.kind, limit=WRAPPED_DEPTH),
                original=value,
                stored_version=state.version,
                created=False,
                deltas=state.deltas_since_base,
            )
        self._drafts[address] = draft
        return draft

    async def create_doc(
        self, definition: DocDefinition, scope_id: int | None = None, key: str | None = None, seed: Any = None
    ) -> DocDraft:
        """Create a document at an address the caller knows is unused (e.g. keyed by an id minted in this
        commit) without asking storage whether it exists. Use `doc()` whenever the address may be in use."""
        self._check()
        address = address_of(definition, scope_id, key)
        known = address in self._drafts or any(address in layer.docs for layer in (self.local, self._overlay))
        hit, cached = self._session.published.docs.get(address)
        if known or (hit and cached is not None):
            return await self.doc(definition, scope_id, key, seed)
        draft = self._new_draft(definition, address, seed)
        self._drafts[address] = draft
        return draft

    def _new_draft(self, definition: DocDefinition, address: DocAddress, seed: Any) -> DocDraft:
        """A draft of a new incarnation at `address`, holding the definition's initial value."""
        record = DocumentRecord(
            id=self.mint_id(),
            kind=definition.kind,
            key=address[3],
            scope=definition.scope,
            scope_id=address[2],
            history=definition.history,
            fork=definition.fork,
            created_seq=self.seq,
        )
        value = definition.make_initial(seed)
        return DocDraft(
            definition,
            record,
            strict_copy(value, definition.kind, limit=definition.depth_limit),
            original=value,
            stored_version=None,
            created=True,
        )

    async def snapshot(
        self, definition: DocDefinition, scope_id: int | None = None, key: str | None = None
    ) -> Any:
        """Read a document's current value (including this commit's draft) without creating it. The value is
        shared, not copied: read it, do not change it (take a `doc()` draft to change a document)."""
        self._check()
        address = address_of(definition, scope_id, key)
        draft = self._drafts.get(address)
        if draft is not None:
            return draft.value
        state = await self._doc_state(address)
        if state is None:
            return None
        return migrated(definition, state.version, state.value)

    async def retire_doc(
        self, definition: DocDefinition, scope_id: int | None = None, key: str | None = None
    ) -> bool:
        """Retire the current incarnation (its final draft content is stored first). A later `doc()` at the
        address creates a new incarnation."""
        self._check()
        address = address_of(definition, scope_id, key)
        return await self.retire_address(address)

    async def retire_address(self, address: DocAddress) -> bool:
        draft = self._drafts.get(address)
        if draft is not None:
            self._retired[address] = draft.record
            self._retired_drafts.append(draft)
            del self._drafts[address]
            self.local.docs[address] = None
            return True
        state = await self._doc_state(address)
        if state is None:
            return False
        self._retired[address] = state.record
        self.local.docs[address] = None
        return True

    async def scan_documents(
        self, scope: Any, scope_id: int | None, kind: str | None = None
    ) -> list[DocumentRecord]:
        """Alive incarnations in one scope, as this commit sees them."""
        known = (
            self._session.published.task_docs.get(scope_id)
            if scope == "task" and scope_id is not None
            else None
        )
        stored: list[DocumentRecord] = []
        if known is not None:  # a task of this process: all its documents are known, no storage scan
            for address in list(known):
                state = await self._doc_state(address)
                if state is not None and (kind is None or address[0] == kind):
                    stored.append(state.record)
        else:
            stored = await self._session.storage.scan_documents(scope=scope, scope_id=scope_id, kind=kind)
        found: dict[DocAddress, DocumentRecord] = {(r.kind, r.scope, r.scope_id, r.key): r for r in stored}
        for layer in (self._overlay, self.local):
            for address, state in layer.docs.items():
                if address[1] == scope and address[2] == scope_id and (kind is None or address[0] == kind):
                    if state is None:
                        found.pop(address, None)
                    else:
                        found[address] = state.record
        for address, draft in self._drafts.items():
            if address[1] == scope and address[2] == scope_id and (kind is None or address[0] == kind):
                found[address] = draft.record
        return sorted(found.values(), key=lambda r: r.id)

    # --- prepare ---------------------------------------------------------------------------------------------

    async def prepare(self) -> tuple[CommitBatch, Publication]:
        """Turn the collected writes into a storage batch and the publication that follows it."""
        from harness_core._session import DocPublication, Publication

        batch = CommitBatch(seq=self.seq, next_id=0)
        publication = Publication(seq=self.seq)
        for conversation_id in {e.conversation_id for e in self._entry_order}:
            if await self.conversation(conversation_id) is None:
                raise NotFound(f"cannot append to conversation {conversation_id}: it does not exist")
        batch.conversations = list(self.local.conversations.values())
        batch.ingress_finished = list(self._ingress_finished)
        batch.entries = list(self._entry_order)
        batch.tasks = list(self.local.tasks.values())
        batch.submissions = list(self.local.submissions.values())
        # Every value a record carries is strict JSON before the batch reaches storage, so serializing it there
        # can neither fail (an unpaired surrogate) nor change it (NaN, a set): a bad value fails this commit
        # only, and the harness stays up (DESIGN.md §2.3).
        for entry in batch.entries:
            check_text(entry.kind, "entry kind")
            if entry.model is not None:
                check_record(entry.model, f"entry {entry.kind} model")
            if entry.edits is not None:
                check_record(entry.edits, f"entry {entry.kind} edits")
        for task in batch.tasks:
            check_text(task.kind, "task kind")
            check_json(task.input, f"task {task.id} input")
            if task.state.checkpoint is not None:
                check_json(task.state.checkpoint, f"task {task.id} checkpoint", limit=WRAPPED_DEPTH)
            check_json(task.memos, f"task {task.id} memos", limit=WRAPPED_DEPTH)
            check_text(task.abort_reason, f"task {task.id} abort reason")
            if task.state.outcome is not None:
                check_record(task.state.outcome, f"task {task.id} outcome")
        for submission in batch.submissions:
            check_text(submission.request_id, f"submission {submission.id} request id")
            check_text(submission.reason, f"submission {submission.id} reason")
            check_text(submission.detail, f"submission {submission.id} detail")
        publication.conversations = batch.conversations
        publication.entries = batch.entries
        publication.tasks = batch.tasks
        publication.submissions = batch.submissions

        # Documents copied by forks: created with their parent's value.
        for address in self._copied_docs:
            state = self.local.docs[address]
            assert state is not None
            batch.doc_creates.append(DocCreate(record=state.record, version=state.version, value=state.value))
            publication.docs.append(
                DocPublication(record=state.record, value=state.value, ops=None, created=True)
            )

        for address, draft in [*self._drafts.items(), *((self._addr(d), d) for d in self._retired_drafts)]:
            self._prepare_draft(address, draft, batch, publication)
        for address, record in self._retired.items():
            retired = record.model_copy(update={"retired_seq": self.seq})
            batch.doc_retires.append(record.id)
            publication.docs.append(DocPublication(record=retired, value=None, ops=None, retired=True))
            if self.local.docs.get(address) is None:
                self.local.docs[address] = None
        return batch, publication

    @staticmethod
    def _addr(draft: DocDraft) -> DocAddress:
        r = draft.record
        return (r.kind, r.scope, r.scope_id, r.key)

    def _prepare_draft(
        self, address: DocAddress, draft: DocDraft, batch: CommitBatch, publication: Publication
    ) -> None:
        from harness_core._session import DocPublication

        definition = draft.definition
        retiring = address in self._retired and self._retired[address].id == draft.record.id
        if draft.created:
            check_text(definition.kind, "document kind")
            check_text(draft.record.key, f"{definition.kind} key")
            final = strict_copy(draft._final(), definition.kind, limit=definition.depth_limit)
            batch.doc_creates.append(DocCreate(record=draft.record, version=definition.version, value=final))
            publication.docs.append(DocPublication(record=draft.record, value=final, ops=None, created=True))
            if not retiring:
                self.local.docs[address] = DocState(draft.record, definition.version, final, 0)
            return
        version_changed = draft.stored_version != definition.version
        final, ops = copy_and_diff(
            draft.original, draft._final(), definition.kind, limit=definition.depth_limit
        )
        if not ops and not version_changed:
            return
        deltas = draft.deltas
        as_base = version_changed or definition.checkpoint_when(final, ops, deltas)
        content = (
            DocumentContent(seq=self.seq, version=definition.version, base=final)
            if as_base
            else DocumentContent(seq=self.seq, version=definition.version, delta=ops)
        )
        batch.doc_changes.append(DocChange(id=draft.record.id, content=content))
        publication.docs.append(DocPublication(record=draft.record, value=final, ops=ops))
        if not retiring:
            self.local.docs[address] = DocState(
                draft.record, definition.version, final, 0 if as_base else deltas + 1
            )


async def _gather_conversations(tx: Tx, ids: list[int]) -> list[Conversation | None]:
    return [await tx.conversation(i) for i in ids]


def _same_json(a: Any, b: Any) -> bool:
    return bool(a == b)
