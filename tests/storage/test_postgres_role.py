"""A worker whose database role did not create the tables (README "The database role"): with the grants the README
names it opens the store, takes a partition, commits, puts and finishes ingress records and queues operator
requests; without the sequence grant its ingress puts are refused by name; on a database still to be migrated it is
told what to do. Real cluster, no mocks."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from pg_partition_support import open_handle

from harness_core import Harness
from harness_core.errors import StorageError
from harness_core.storage import PostgresStore


@asynccontextmanager
async def table_rights_only(url: str, *, sequences: bool) -> AsyncIterator[str]:
    """The URL of a new login role with rights on the tables of `url`'s database (and on its sequences if
    `sequences`), nothing more: PostgreSQL 15 lets no other role create in `public` by default."""
    role = f"worker_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
        if sequences:
            await admin.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
        parts = urlsplit(url)
        yield urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rsplit('@', 1)[-1]}"))
    finally:
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE {role}")
        await admin.close()


async def test_a_role_with_the_readmes_grants_runs_a_worker(pg_url: str) -> None:
    async with table_rights_only(pg_url, sequences=True) as url:
        store = await PostgresStore.open(url, partitions=4)
        try:
            harness = await Harness.open(await open_handle(store, 1))
            try:
                made = await harness.create_conversation()
                assert await harness.conversation(made.id) is not None
            finally:
                await harness.close()
            assert await store.put_ingress(2, "message", "slack:T1:C1:1.0", {"text": "hi"})
            (record,) = await store.pending_ingress([2])
            await store.finish_ingress(record.id)
            assert await store.pending_ingress([2]) == []
            assert await store.reader().put_operator_request("retry", {"task": 5}) > 0
        finally:
            await store.close()


async def test_without_the_sequence_grant_ingress_puts_are_refused_by_name(pg_url: str) -> None:
    async with table_rights_only(pg_url, sequences=False) as url:
        store = await PostgresStore.open(url, partitions=4)
        try:
            with pytest.raises(Exception, match="permission denied for sequence ingress_id_seq"):
                await store.put_ingress(2, "message", "slack:T1:C1:1.0", {"text": "hi"})
        finally:
            await store.close()


async def test_a_role_that_may_not_create_tables_is_told_how_to_migrate(pg_empty_url: str) -> None:
    async with table_rights_only(pg_empty_url, sequences=True) as url:
        with pytest.raises(StorageError, match="open it once as a role that may create tables") as refused:
            await PostgresStore.open(url, partitions=4)
        assert "version 0 of" in str(refused.value) and "permission denied for schema public" in str(
            refused.value
        )
