"""Prometheus metrics of one running bot, on a registry of its own (several bots can share a process).

The hot path only increments: counters and histograms owned here (model requests, tool runs, commits) are
updated where the work happens; the bridge's plain integer counters, the adapters' connection health and the
gauges (parked tasks, pending approvals, inbox depth) are read when `/metrics` is scraped, in the event loop
(`sample()`), so the scrape sees one consistent picture and the loop never pays for metrics it is not asked
for.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from adapters.base import Adapter
from adapters.bridge import Bridge, RateGovernor
from adapters.bridge.stats import BridgeStats
from adapters.health import health_of
from harness_core import CORE_TOOL_RESULT, Harness, Publication
from harness_core.messages import AssistantMessage, ToolResultMessage
from harness_core.models import ModelInfo, ModelRequest, Provider
from harness_core.storage import CommitBatch, Storage

NAMESPACE = "durable_bots"
_LATENCY_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160)
_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)


def _counter(registry: CollectorRegistry, name: str, documentation: str, *labels: str) -> Counter:
    return Counter(name, documentation, labels, namespace=NAMESPACE, registry=registry)


def _histogram(
    registry: CollectorRegistry, name: str, documentation: str, buckets: Sequence[float], *labels: str
) -> Histogram:
    return Histogram(name, documentation, labels, namespace=NAMESPACE, buckets=buckets, registry=registry)


@dataclass
class Sample:
    """What a scrape reads from the running bot (taken in the event loop, see `BotMetrics.sample`)."""

    taken_in: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    answers: dict[str, int] = field(default_factory=dict)
    decided: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    rate_limited: dict[str, int] = field(default_factory=dict)
    reconnects: dict[str, int] = field(default_factory=dict)
    connected: dict[str, bool] = field(default_factory=dict)
    parked: int = 0
    approvals_pending: int = 0
    inbox_depth: int = 0


class BotMetrics:
    """Every metric of one bot. `bind()` connects it to the running harness, bridge and adapters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.model_requests = _counter(
            r, "model_requests", "Model requests by model and outcome", "model", "outcome"
        )
        self.model_latency = _histogram(
            r,
            "model_request_seconds",
            "Model request time, first byte to last, by model",
            _LATENCY_BUCKETS,
            "model",
        )
        self.model_tokens = _counter(
            r,
            "model_tokens",
            "Tokens by model and kind (input, output, cache_read, cache_write)",
            "model",
            "kind",
        )
        self.model_cost = _counter(r, "model_cost_dollars", "Model cost in US dollars by model", "model")
        self.tool_runs = _counter(
            r, "tool_runs", "Tool results committed, by tool and outcome (ok, error)", "tool", "outcome"
        )
        self.commit_latency = _histogram(
            r, "commit_seconds", "Time one storage commit (a group of harness commits) took", _COMMIT_BUCKETS
        )
        self.loop_lag = Gauge(
            "event_loop_lag_seconds",
            "How late the event loop ran a callback scheduled for now (last probe)",
            namespace=NAMESPACE,
            registry=r,
        )
        self._sampler: Callable[[], Sample] | None = None
        r.register(_ScrapeCollector(self))
        self.bridge: Bridge | None = None
        self.harness: Harness | None = None
        self.adapters: Sequence[Adapter] = ()
        # A worker with several partitions: every (harness, bridge) it runs now, and its shared governors.
        self._parts: Callable[[], Sequence[tuple[Harness, Bridge]]] | None = None
        self._governors: Callable[[], dict[str, RateGovernor]] | None = None
        # The counts of partitions that left this worker: Prometheus counters must never go back.
        self._retired = BridgeStats()
        self._leaving: list[BridgeStats] = []  # partitions being closed: still counting, no longer in parts

    # --- wiring -----------------------------------------------------------------------------------------------

    def bind(self, harness: Harness, bridge: Bridge, adapters: Sequence[Adapter]) -> Callable[[], None]:
        """Count the harness's commits (tool runs) and read bridge and adapters at scrape time; returns the
        function that unsubscribes."""
        self.harness, self.bridge, self.adapters = harness, bridge, adapters
        return harness.add_publication_listener(self.on_publication)

    def bind_parts(
        self,
        parts: Callable[[], Sequence[tuple[Harness, Bridge]]],
        governors: Callable[[], dict[str, RateGovernor]],
        adapters: Sequence[Adapter],
    ) -> None:
        """A worker (bots/workers.py): read every partition it runs at scrape time, summed; tool runs are
        counted by subscribing `on_publication` to each partition's harness while it runs."""
        self._parts, self._governors, self.adapters = parts, governors, adapters

    def leaving(self, bridge: Bridge) -> None:
        """A partition's bridge leaves this worker (lost or handed over): counted from here on until `retire`,
        so no scrape while it closes misses its counts."""
        self._leaving.append(bridge.stats)

    def retire(self, bridge: Bridge) -> None:
        """The partition's bridge has stopped: its final counts stay in the totals."""
        self._leaving = [stats for stats in self._leaving if stats is not bridge.stats]
        self._retired.add(bridge.stats)

    def on_publication(self, publication: Publication) -> None:
        for entry in publication.entries:
            if entry.kind != CORE_TOOL_RESULT:
                continue
            for message in entry.model or ():
                if isinstance(message, ToolResultMessage):
                    outcome = "error" if message.is_error else "ok"
                    self.tool_runs.labels(message.tool_name, outcome).inc()

    def set_sampler(self, sampler: Callable[[], Sample] | None) -> None:
        """How a scrape gets the `Sample` (the admin server runs `sample()` in the event loop)."""
        self._sampler = sampler

    async def sample(self) -> Sample:
        """Read counters and gauges of the running bot (of every partition a worker runs, summed). Runs in the
        event loop."""
        found = Sample()
        _add_counts(found, self._retired)
        for stats in self._leaving:
            _add_counts(found, stats)
        if self._parts is not None:
            parts = list(self._parts())
        else:
            parts = (
                [(self.harness, self.bridge)] if self.harness is not None and self.bridge is not None else []
            )
        shared = self._governors() if self._governors is not None else None
        if shared is not None:
            _add_governors(found, shared)
        for harness, bridge in parts:
            _add_bridge(found, bridge)
            if shared is None:
                _add_governors(found, bridge.governors())
            if not harness.closed.done():
                inspection = await harness.inspect()
                found.parked += len(inspection.parked())
                found.inbox_depth += sum(1 for s in inspection.submissions if s.status == "queued")
        for adapter in self.adapters:
            health = health_of(adapter)
            if health is not None:
                found.reconnects[health.platform] = health.reconnects
                found.connected[health.platform] = health.connected
        return found

    # --- wrappers that measure --------------------------------------------------------------------------------

    def provider(self, inner: Provider) -> Provider:
        return _MeteredProvider(inner, self)

    def storage(self, inner: Storage) -> Storage:
        return _TimedStorage(inner, self)


def _add_governors(found: Sample, governors: dict[str, RateGovernor]) -> None:
    for platform, governor in governors.items():
        found.writes[platform] = found.writes.get(platform, 0) + governor.writes
        found.rate_limited[platform] = found.rate_limited.get(platform, 0) + governor.rate_limited


def _add_bridge(found: Sample, bridge: Bridge) -> None:
    _add_counts(found, bridge.stats)
    found.approvals_pending += sum(
        1 for gate in bridge.approvals.gates.values() if gate.get("status") == "pending"
    )


def _add_counts(found: Sample, stats: BridgeStats) -> None:
    for mine, theirs in (
        (found.taken_in, stats.taken_in),
        (found.duplicates, stats.duplicates),
        (found.answers, stats.answers_delivered),
        (found.decided, stats.approvals_decided),
    ):
        for key, value in theirs.items():
            mine[key] = mine.get(key, 0) + value


class _ScrapeCollector(Collector):
    def __init__(self, metrics: BotMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing to describe before the first scrape (registered with auto_describe)

    def collect(self) -> Iterable[Metric]:
        sampler = self.metrics._sampler
        if sampler is None:
            return
        s = sampler()
        yield _by("messages_taken_in", "Human messages committed by intake", "platform", s.taken_in)
        yield _by(
            "duplicates_dropped",
            "Messages intake had already taken in (platform retries)",
            "platform",
            s.duplicates,
        )
        yield _by("answers_delivered", "Answers whose final text reached the platform", "platform", s.answers)
        yield _by("platform_writes", "Posts and edits sent to the platform", "platform", s.writes)
        yield _by(
            "platform_rate_limited",
            "Platform writes answered with 429 / Retry-After",
            "platform",
            s.rate_limited,
        )
        yield _by("reconnects", "Platform connections opened after the first", "platform", s.reconnects)
        yield _by("approvals_decided", "Accepted approval decisions by outcome", "outcome", s.decided)
        connected = GaugeMetricFamily(
            f"{NAMESPACE}_adapter_connected", "1 while the platform connection is up", labels=["platform"]
        )
        for platform, up in sorted(s.connected.items()):
            connected.add_metric([platform], 1.0 if up else 0.0)
        yield connected
        yield GaugeMetricFamily(
            f"{NAMESPACE}_approvals_pending",
            "Approval requests waiting for a human",
            value=s.approvals_pending,
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_parked_tasks", "Tasks parked after repeated crashes (see `retry`)", value=s.parked
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_inbox_depth", "Submissions queued behind a running answer", value=s.inbox_depth
        )


def _by(name: str, documentation: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{NAMESPACE}_{name}", documentation, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], float(value))
    return family


class _MeteredProvider:
    """A model provider that counts requests, time, tokens and cost of each stream it hands out."""

    def __init__(self, inner: Provider, metrics: BotMetrics) -> None:
        self.inner = inner
        self.metrics = metrics
        self.name = inner.name

    def model(self, model_id: str) -> ModelInfo | None:
        return self.inner.model(model_id)

    async def stream(self, model: ModelInfo, request: ModelRequest) -> AsyncGenerator[AssistantMessage, None]:
        metrics = self.metrics
        label = f"{model.provider}:{model.id}"
        started = time.monotonic()
        last: AssistantMessage | None = None
        try:
            async for message in self.inner.stream(model, request):
                last = message
                yield message
        finally:
            # The caller may stop iterating at the final message: judge by the last message seen.
            finished = last is not None and last.stop_reason in ("stop", "length", "toolUse")
            outcome = "ok" if finished and last is not None and last.error is None else "error"
            metrics.model_requests.labels(label, outcome).inc()
            metrics.model_latency.labels(label).observe(time.monotonic() - started)
            if last is not None:
                usage = last.usage
                for kind in ("input", "output", "cache_read", "cache_write"):
                    amount = getattr(usage, kind)
                    if amount:
                        metrics.model_tokens.labels(label, kind).inc(amount)
                if usage.cost:
                    metrics.model_cost.labels(label).inc(usage.cost)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _TimedStorage:
    """The storage with its commits timed; every other call goes straight through."""

    def __init__(self, inner: Storage, metrics: BotMetrics) -> None:
        self._inner = inner
        self._histogram = metrics.commit_latency

    async def commit(self, batches: Sequence[CommitBatch]) -> None:
        started = time.perf_counter()
        try:
            await self._inner.commit(batches)
        finally:
            self._histogram.observe(time.perf_counter() - started)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
