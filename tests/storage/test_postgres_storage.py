"""PostgreSQL specifics beyond the conformance suite: lease, fencing, standby, read-only opens, migrations,
a connection killed mid-commit (pg_terminate_backend)."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

import asyncpg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness_core import EntryDraft, Harness, Tx
from harness_core.errors import LeaseLost, StorageError, StorageLocked
from harness_core.records import Conversation, Entry
from harness_core.storage import CommitBatch, LeaseHolder, PostgresStorage, redact_url
from harness_core.storage._postgres_schema import SCHEMA_VERSION


def note(entry_id: int, seq: int) -> Entry:
    return Entry(id=entry_id, conversation_id=1, kind="t.note", data={"n": entry_id}, seq=seq)


async def expire_lease(url: str) -> None:
    """What a paused holder looks like from outside: its lease ran out by the server's clock."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("UPDATE leases SET expires_at = now() - interval '1 second'")
    finally:
        await conn.close()


async def test_a_second_writer_is_refused_naming_the_holder(pg_url: str) -> None:
    first = await PostgresStorage.open(pg_url)
    try:
        with pytest.raises(StorageLocked) as info:
            await PostgresStorage.open(pg_url)
        assert "lease held by pid" in str(info.value)
    finally:
        await first.close()
    second = await PostgresStorage.open(pg_url)  # released at close: free at once
    await second.close()


async def test_standby_takes_over_quickly_after_a_graceful_close(pg_url: str) -> None:
    leader = await PostgresStorage.open(pg_url)
    await leader.commit([CommitBatch(seq=1, next_id=10, conversations=[Conversation(id=1)])])
    seen: list[LeaseHolder] = []
    standby = asyncio.create_task(PostgresStorage.open(pg_url, on_standby=seen.append))
    await asyncio.sleep(0.7)
    assert not standby.done()
    assert len(seen) == 1
    assert seen[0].describe().startswith("pid ")
    closed_at = time.monotonic()
    await leader.close()
    successor = await asyncio.wait_for(standby, timeout=5)
    try:
        assert time.monotonic() - closed_at < 2.0
        assert await successor.conversation(1) is not None
        assert (await successor.meta()).last_seq == 1
    finally:
        await successor.close()


async def test_standby_takes_over_an_expired_lease_and_fences_the_old_holder(pg_url: str) -> None:
    old = await PostgresStorage.open(pg_url, lease_ttl=30)
    await old.commit([CommitBatch(seq=1, next_id=10, conversations=[Conversation(id=1)])])
    await expire_lease(pg_url)  # as if `old` had been paused past its ttl
    new = await PostgresStorage.open(pg_url, lease_ttl=30, on_standby=lambda holder: None)
    try:
        new_meta = await new.meta()
        # Fencing: the old holder's next commit is refused inside its transaction, and nothing is written.
        with pytest.raises(LeaseLost):
            await old.commit([CommitBatch(seq=2, next_id=20, entries=[note(11, 2)])])
        assert await new.entry(11) is None
        assert old.lease is not None
        with pytest.raises(LeaseLost):
            old.check_owner()
        # The successor mints above anything the old holder could have stored.
        assert new_meta.next_id >= 10
        await new.commit([CommitBatch(seq=new_meta.last_seq + 1, next_id=new_meta.next_id + 1, entries=[])])
        # The old holder's close does not release the successor's lease.
        await old.close()
        with pytest.raises(StorageLocked):
            await PostgresStorage.open(pg_url)
    finally:
        await old.close()
        await new.close()


async def test_lease_validity_by_the_monotonic_clock(pg_url: str) -> None:
    storage = await PostgresStorage.open(pg_url, lease_ttl=1.0)
    try:
        lease = storage.lease
        assert lease is not None
        assert lease.valid()
        assert storage.not_ready() is None
        storage.check_owner()
        await asyncio.sleep(2.5)  # renewed every ttl/3 meanwhile
        assert lease.valid()
        await storage.commit([CommitBatch(seq=1, next_id=2, conversations=[Conversation(id=1)])])
    finally:
        await storage.close()


async def test_renewal_notices_a_takeover_and_reports_why(pg_url: str) -> None:
    old = await PostgresStorage.open(pg_url, lease_ttl=1.5)
    await expire_lease(pg_url)
    new = await PostgresStorage.open(pg_url, lease_ttl=1.5, on_standby=lambda holder: None)
    try:
        assert old.lease is not None
        reason = await asyncio.wait_for(old.lease.lost, timeout=5)
        assert "taken over" in reason
        assert not old.lease.valid()
        assert old.not_ready() == "storage lease lost"
        assert new.not_ready() is None
    finally:
        await old.close()
        await new.close()


async def test_read_only_open_needs_no_lease_and_refuses_commits(pg_url: str) -> None:
    leader = await PostgresStorage.open(pg_url)
    try:
        await leader.commit([CommitBatch(seq=1, next_id=10, conversations=[Conversation(id=1)])])
        reader = await PostgresStorage.open_read_only(pg_url)
        try:
            assert reader.read_only
            assert await reader.conversation(1) is not None
            with pytest.raises(StorageError, match="read-only"):
                await reader.commit([CommitBatch(seq=2, next_id=11)])
        finally:
            await reader.close()
        # The reader's close left the leader's lease alone.
        await leader.commit([CommitBatch(seq=2, next_id=11, entries=[note(10, 2)])])
    finally:
        await leader.close()


async def test_read_only_open_of_a_database_without_a_store_says_so(pg_empty_url: str) -> None:
    with pytest.raises(StorageError, match="no harness store"):
        await PostgresStorage.open(pg_empty_url, read_only=True)


async def test_migrations_run_on_an_empty_database_and_a_newer_schema_is_refused(pg_empty_url: str) -> None:
    storage = await PostgresStorage.open(pg_empty_url)
    await storage.close()
    conn = await asyncpg.connect(pg_empty_url)
    try:
        assert await conn.fetchval("SELECT version FROM schema_version") == SCHEMA_VERSION
        await conn.execute("UPDATE schema_version SET version = $1", SCHEMA_VERSION + 1)
    finally:
        await conn.close()
    with pytest.raises(StorageError, match="newer than this build"):
        await PostgresStorage.open(pg_empty_url)
    # An operator command of an older build says the same, not "start the bot once to migrate it".
    with pytest.raises(StorageError, match=r"newer than this build knows .*; upgrade durable-bots"):
        await PostgresStorage.open_read_only(pg_empty_url)


async def test_the_description_never_shows_the_password() -> None:
    assert redact_url("postgresql://bot:s3cret@db.example:5433/ops?sslmode=require&password=x") == (
        "postgresql://bot@db.example:5433/ops"
    )
    with pytest.raises(StorageError) as info:
        await PostgresStorage.open("postgresql://bot:s3cret@127.0.0.1:1/ops", connect_timeout=2)
    assert "s3cret" not in str(info.value)
    assert "postgresql://bot@127.0.0.1:1/ops" in str(info.value)


async def terminate_the_waiting_backend(admin: asyncpg.Connection) -> bool:
    """Wait (up to 5 s) for another backend to block on a lock, then terminate it, as a lost connection would."""
    victim = None
    for _ in range(100):
        victim = await admin.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() "
            "AND datname = current_database()"  # never a backend of another database (the next test's, made ahead)
        )
        if victim is not None:
            break
        await asyncio.sleep(0.05)
    assert victim is not None
    return bool(await admin.fetchval("SELECT pg_terminate_backend($1)", victim))


async def test_a_connection_killed_mid_commit_fails_the_commit_and_leaves_a_consistent_store(
    pg_url: str,
) -> None:
    storage = await PostgresStorage.open(pg_url)
    await storage.commit([CommitBatch(seq=1, next_id=10, conversations=[Conversation(id=1)])])
    admin = await asyncpg.connect(pg_url)
    try:
        # Hold a lock the commit needs, so it is caught inside its transaction (after the fence, mid-write).
        blocker = admin.transaction()
        await blocker.start()
        await admin.execute("LOCK TABLE entries IN ACCESS EXCLUSIVE MODE")
        commit = asyncio.create_task(
            storage.commit([CommitBatch(seq=2, next_id=20, entries=[note(11, 2), note(12, 2)])])
        )
        assert await terminate_the_waiting_backend(admin)
        await blocker.rollback()
        with pytest.raises(StorageError, match="outcome unknown"):
            await commit
    finally:
        await admin.close()
    await storage.close()  # what the harness does on an uncertain failure; releases the lease
    successor = await PostgresStorage.open(pg_url)
    try:
        assert await successor.entry(11) is None
        assert await successor.entry(12) is None
        meta = await successor.meta()
        assert meta.last_seq >= 1
        assert meta.next_id >= 10
        await successor.commit([CommitBatch(seq=meta.last_seq + 1, next_id=meta.next_id, entries=[])])
    finally:
        await successor.close()


async def test_the_harness_closes_on_a_connection_killed_mid_commit_and_the_next_leader_reads_a_whole_store(
    pg_url: str,
) -> None:
    harness = await Harness.open(await PostgresStorage.open(pg_url))
    conversation = await harness.create_conversation()
    admin = await asyncpg.connect(pg_url)
    try:
        blocker = admin.transaction()
        await blocker.start()
        await admin.execute("LOCK TABLE entries IN ACCESS EXCLUSIVE MODE")

        async def two_notes(tx: Tx) -> None:
            tx.append_entry(conversation.id, EntryDraft(kind="t.note", data={"n": 1}))
            tx.append_entry(conversation.id, EntryDraft(kind="t.note", data={"n": 2}))

        commit = asyncio.create_task(harness.commit(two_notes))
        await terminate_the_waiting_backend(admin)
        await blocker.rollback()
        with pytest.raises(Exception):  # noqa: B017  (the commit fails; the harness reports why on `closed`)
            await commit
    finally:
        await admin.close()
    info = await asyncio.wait_for(harness.closed, 10)
    assert info.reason == "failed"
    await harness.close()  # releases the lease
    successor = await Harness.open(await PostgresStorage.open(pg_url))
    try:
        handle = await successor.conversation(conversation.id)
        assert handle is not None
        page = await handle.entries(limit=50)
        assert [e for e in page.items if e.kind == "t.note"] == []  # all or nothing: nothing
        await successor.commit(two_notes)
        page = await handle.entries(limit=50)
        assert sorted(e.data["n"] for e in page.items if e.kind == "t.note") == [1, 2]
    finally:
        await successor.close()


async def test_a_dropped_renewal_connection_is_replaced_and_the_lease_kept(pg_url: str) -> None:
    storage = await PostgresStorage.open(pg_url, lease_ttl=1.5)
    admin = await asyncpg.connect(pg_url)
    try:
        renewer = None
        for _ in range(100):
            renewer = await admin.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE '%UPDATE leases SET expires_at%' "
                "AND pid <> pg_backend_pid() LIMIT 1"
            )
            if renewer is not None:
                break
            await asyncio.sleep(0.05)
        assert renewer is not None
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", renewer)
        await asyncio.sleep(3.0)  # two ttls: renewed on a new connection meanwhile
        assert storage.lease is not None
        assert storage.lease.valid()
        await storage.commit([CommitBatch(seq=1, next_id=2, conversations=[Conversation(id=1)])])
    finally:
        await admin.close()
        await storage.close()


@settings(max_examples=200, deadline=None)
@given(
    user=st.text(min_size=1, max_size=12),
    password=st.text(min_size=4, max_size=24),
    host=st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z]{2,5})?", fullmatch=True),
    query=st.sampled_from(["", "?sslmode=require", "?password=other-secret"]),
)
def test_redacted_urls_never_hold_the_password(user: str, password: str, host: str, query: str) -> None:
    dsn = f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}@{host}:5432/ops{query}"
    # Exactly user, host, port and database: no password field, no query (which may carry one too).
    assert redact_url(dsn) == f"postgresql://{quote(user, safe='')}@{host}:5432/ops"


def test_a_multi_host_url_is_described_without_its_password() -> None:
    """libpq's multi-host form (a primary and its standbys) has no single port urlsplit can read: it must still
    be described, never crash the bot's start with a ValueError."""
    shown = redact_url("postgresql://bot:s3cret@db1:5432,db2:5432/ops?target_session_attrs=read-write")
    assert "s3cret" not in shown and shown == "postgresql://bot@db1:5432,db2:5432/ops"
