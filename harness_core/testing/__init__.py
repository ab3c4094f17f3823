"""Test helpers for code built on harness_core.

`register_storage_conformance` checks a storage backend against the `Storage` contract: it adds a pytest test
class to your test module that runs the whole conformance suite on storages made by your factory. Every
built-in backend runs it, and so should yours::

    # tests/test_my_storage.py
    from pathlib import Path

    from harness_core.storage import Storage
    from harness_core.testing import register_storage_conformance
    from my_package import MyStorage


    async def make(tmp_path: Path) -> Storage:
        return await MyStorage.open(tmp_path / "store")


    async def reopen(storage: Storage, tmp_path: Path) -> Storage:
        await storage.close()
        return await MyStorage.open(tmp_path / "store")


    register_storage_conformance(globals(), "my", make, reopen=reopen)  # adds TestMyStorageConformance

The tests are coroutines, so run pytest with pytest-asyncio in auto mode (`asyncio_mode = "auto"`). Each test
gets a fresh storage from `factory(tmp_path)` and closes it at the end. When `reopen` is given (close the
storage and open the same data again), every test also runs in a variant that reopens after every commit,
which checks that everything a commit wrote comes back from disk.

`start_cluster()` starts a throwaway PostgreSQL server (`TemporaryPostgres`, from the `postgresql` package's
initdb/pg_ctl) for tests of code on `PostgresStorage`; `stop()` it at the end.
"""

from harness_core.testing._postgres_cluster import TemporaryPostgres, start_cluster
from harness_core.testing._storage_conformance import (
    StorageFactory,
    StorageReopen,
    StoreUnderTest,
    register_storage_conformance,
)

__all__ = [
    "StorageFactory",
    "StorageReopen",
    "StoreUnderTest",
    "TemporaryPostgres",
    "register_storage_conformance",
    "start_cluster",
]
