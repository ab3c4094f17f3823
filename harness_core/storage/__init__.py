"""Storage backends behind one small contract (`Storage`), like httpx transports behind a client.

- `MemoryStorage`: reference semantics, nothing survives the process.
- `SqliteStorage`: aiosqlite, WAL, `synchronous=NORMAL` (or FULL with `durability="full"`); the default.
- `JsonlStorage`: append-only files with one commit marker per commit.
- `PostgresStorage`: asyncpg; shared by processes on several machines, one lease holder writes, standbys wait.
  `PostgresStore` splits one database into partitions for many workers: `open_partition(p)` gives a
  `PostgresStorage` bound to p; the store also carries ingress (exactly once across workers), the workers'
  heartbeats and resource leases.

Optional capability: `OperatorRequests` (a durable channel from operator commands to the running owner);
`SqliteStorage` and `PostgresStorage` implement it.
"""

from harness_core.storage._copy import CopyReport, copy_sqlite_to_postgres
from harness_core.storage._jsonl import JsonlStorage
from harness_core.storage._memory import MemoryStorage
from harness_core.storage._operator import (
    FINISHED_REQUESTS_KEPT,
    OperatorRequest,
    OperatorRequests,
    OperatorRequestStatus,
)
from harness_core.storage._postgres import PostgresStorage, redact_url
from harness_core.storage._postgres_balance import Balancer, Resources, assign
from harness_core.storage._postgres_ingress import IngressRecord, WorkerInfo
from harness_core.storage._postgres_lease import Lease, LeaseHolder
from harness_core.storage._postgres_store import PostgresStore, ResourceLease
from harness_core.storage._protocol import CommitBatch, DocChange, DocCreate, Order, Storage, StorageMeta
from harness_core.storage._sqlite import SqliteStorage

__all__ = [
    "FINISHED_REQUESTS_KEPT",
    "Balancer",
    "CommitBatch",
    "CopyReport",
    "DocChange",
    "DocCreate",
    "IngressRecord",
    "JsonlStorage",
    "Lease",
    "LeaseHolder",
    "MemoryStorage",
    "OperatorRequest",
    "OperatorRequestStatus",
    "OperatorRequests",
    "Order",
    "PostgresStorage",
    "PostgresStore",
    "ResourceLease",
    "Resources",
    "SqliteStorage",
    "Storage",
    "StorageMeta",
    "WorkerInfo",
    "assign",
    "copy_sqlite_to_postgres",
    "redact_url",
]
