"""Pool metrics: pools, workers, KV index, KV transfers and discovery changes, as this router sees them.

``PoolMetrics.refresh`` reads the controller's state (an immutable pool snapshot, the accounting, the KV router's
scraped loads and index statistics) and sets the gauges; the controller calls it on every discovery change and every
``sync_interval_s``. It reads, never waits, and costs a few label lookups per worker. Series of departed workers are
removed (set to 0 first, so a multi-process collector keeps a zero rather than the last value). ``transfers`` turns
the load scraper's ``TransferSample`` into counters.

One per controller; the gauges are process-wide, so with several routers in one process (tests) the last refresh wins.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from litellm_disagg.observability import metrics as m
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.runtime_config import WorkerRole, WorkerState

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge

    from litellm_disagg.routing.accounting import Accounting
    from litellm_disagg.routing.cooldown import FailureCooldown
    from litellm_disagg.routing.kv.load_scraper import TransferSample
    from litellm_disagg.routing.kv.router import KVRouter

_PER_WORKER: tuple[Gauge, ...] = (
    m.WORKER_COOLING,
    m.WORKER_INFLIGHT,
    m.WORKER_QUEUED_PREFILL,
    m.WORKER_RUNNING,
    m.WORKER_WAITING,
    m.WORKER_KV_USAGE,
)
_ROLES = tuple(r.value for r in WorkerRole)
_STATES = tuple(s.value for s in WorkerState)


class PoolMetrics:
    def __init__(self) -> None:
        self._pool = WorkerPool()
        self._workers: dict[str, tuple[str, str, str]] = {}
        """worker id -> (model, role, state) as last published."""
        self._scraped: set[str] = set()
        self._counts: set[tuple[str, str, str]] = set()
        self._models: set[str] = set()
        self._events: dict[str, tuple[int, int]] = {}
        """worker id -> (batches, gaps) last counted, of its current applier."""
        self._appliers: dict[str, int] = {}
        self._failover: set[tuple[str, str, str]] = set()

    # -- discovery ----------------------------------------------------------------------------------------------------

    def pool_changed(self, pool: WorkerPool) -> None:
        """A new discovery snapshot: worker counts and states, series of departed workers removed."""
        self._pool = pool
        m.DISCOVERY_LAST_CHANGE.set(time.time())
        now = {w.worker_id: (w.model, w.role.value, w.state.value) for w in pool.workers}
        for worker_id, labels in self._workers.items():
            if now.get(worker_id) != labels:
                _drop(m.WORKER_STATE, (*_worker_labels(worker_id, labels), labels[2]))
            if worker_id not in now or now[worker_id][:2] != labels[:2]:
                for gauge in _PER_WORKER:
                    _drop(gauge, _worker_labels(worker_id, labels))
                self._scraped.discard(worker_id)
        for worker_id, labels in now.items():
            m.WORKER_STATE.labels(*_worker_labels(worker_id, labels), labels[2]).set(1)
        self._workers = now
        counts: dict[tuple[str, str, str], int] = {}
        for model, role, state in now.values():
            counts[(model, role, state)] = counts.get((model, role, state), 0) + 1
        models = {w.model for w in pool.workers}
        # Every (role, state) of a known model has a series (0 when empty), so "no ready prefill worker" reads 0.
        for model in models:
            for role in _ROLES:
                for state in _STATES:
                    counts.setdefault((model, role, state), 0)
        for key in self._counts - set(counts):
            _drop(m.WORKERS, key)
        for key, value in counts.items():
            m.WORKERS.labels(*key).set(value)
        self._counts = set(counts)
        for model in models - self._models:
            self._first_sight(model)
        self._models |= models
        # Failover counters read 0 for every prefill worker (and cause) from its first sight; removed when it leaves.
        failover = {(w.model, w.worker_id, cause) for w in pool.workers if w.role.can_prefill for cause in m.FAILOVER_CAUSES}
        for labels in self._failover - failover:
            _remove(m.PREFILL_FAILOVERS, labels)
        for labels in failover - self._failover:
            m.PREFILL_FAILOVERS.labels(*labels)
        self._failover = failover

    def _first_sight(self, model: str) -> None:
        """Counters that read 0 rather than nothing before their first event; the planner's placeholders."""
        for cause in m.FALLBACK_CAUSES:
            m.AGGREGATED_FALLBACKS.labels(model, cause)
        for reason in m.LOCAL_REASONS:
            m.LOCAL_PREFILLS.labels(model, reason)
        for mode in m.MODES:
            for cause in m.FAILURE_CAUSES:
                m.REQUEST_FAILURES.labels(model, mode, cause)
        for action in m.PLANNER_ACTIONS:
            m.PLANNER_DECISIONS.labels(model, action)
        for role in ("prefill", "decode", "both"):
            m.PLANNER_DESIRED_WORKERS.labels(model, role).set(math.nan)  # until a planner's next step says

    # -- periodic -----------------------------------------------------------------------------------------------------

    def refresh(self, accounting: Accounting, cooldown: FailureCooldown, kv: KVRouter | None) -> None:
        requests, prefill_tokens, _ = accounting.own_lookups()  # each replica its own: Prometheus sums them
        scraped = kv.scraper.lookup() if kv is not None else None
        for worker_id, labels in self._workers.items():
            wl = _worker_labels(worker_id, labels)
            m.WORKER_INFLIGHT.labels(*wl).set(requests(worker_id, 0))
            m.WORKER_QUEUED_PREFILL.labels(*wl).set(prefill_tokens(worker_id, 0))
            m.WORKER_COOLING.labels(*wl).set(1 if cooldown.cooling(worker_id) else 0)
            if scraped is not None:
                load = scraped(worker_id)
                if not load.stale or worker_id in self._scraped:
                    self._scraped.add(worker_id)
                    m.WORKER_RUNNING.labels(*wl).set(load.running)
                    m.WORKER_WAITING.labels(*wl).set(load.waiting)
                    m.WORKER_KV_USAGE.labels(*wl).set(load.kv_usage)
        if kv is not None:
            self._kv(kv)

    def _kv(self, kv: KVRouter) -> None:
        stats = kv.index_stats()
        m.KV_INDEX_WORKERS.set(stats.workers)
        for kind, value in zip(
            m.INDEX_KINDS, (stats.held_blocks, stats.distinct_blocks, stats.predicted_blocks, stats.pending_release),
            strict=True,
        ):
            m.KV_INDEX_BLOCKS.labels(kind).set(value)
        estimates = kv.decider.estimates()
        for phase, line in (
            ("prefill", estimates.prefill), ("transfer", estimates.transfer), ("local", estimates.local),
            ("remote_tail", estimates.remote_tail),
        ):
            if line is None:
                continue
            m.COST_RATE.labels(phase).set(line.tokens_per_s)
            m.COST_OVERHEAD.labels(phase).set(line.overhead_s)
        if kv.progress is not None:  # the line that estimates how far each worker is through its queued prompts
            line = kv.progress.line.estimate()
            m.COST_RATE.labels("progress").set(line.tokens_per_s)
            m.COST_OVERHEAD.labels("progress").set(line.overhead_s)
        if estimates.decode_time_weight is not None:
            source = "fitted" if estimates.decode_time_weight_fitted else "prior"
            m.COST_STALL_WEIGHT.labels(source).set(estimates.decode_time_weight)
            _drop(m.COST_STALL_WEIGHT, ("prior" if estimates.decode_time_weight_fitted else "fitted",))
        stall = kv.decider.stall.estimate()
        for kind, mean, count in (("base", stall.base_gap_s, stall.base_gaps),
                                  ("during", stall.during_gap_s, stall.during_gaps)):
            m.COST_STALL_GAPS.labels(kind).set(count)
            if mean is not None:
                m.COST_STALL_GAP.labels(kind).set(mean)
        events = kv.event_stats()
        for worker_id, applier in events.items():
            seen_batches, seen_gaps = self._events.get(worker_id, (0, 0))
            if self._appliers.get(worker_id) != id(applier):  # a new subscription: its counts start again
                self._appliers[worker_id] = id(applier)
                seen_batches = seen_gaps = 0
            if applier.batches > seen_batches:
                m.KV_EVENT_BATCHES.labels(worker_id).inc(applier.batches - seen_batches)
            if applier.gaps > seen_gaps:
                m.KV_EVENT_GAPS.labels(worker_id).inc(applier.gaps - seen_gaps)
            self._events[worker_id] = (applier.batches, applier.gaps)
            applied_at, batch_ts = applier.last_applied_at, applier.last_batch_ts
            if applied_at is not None and batch_ts is not None:
                m.KV_EVENT_LAG.labels(worker_id).set(max(0.0, applied_at - batch_ts))
                m.KV_EVENT_LAST_APPLIED.labels(worker_id).set(applied_at)
        for gone in set(self._events) - set(events):
            del self._events[gone]
            self._appliers.pop(gone, None)
            for gauge in (m.KV_EVENT_LAG, m.KV_EVENT_LAST_APPLIED):
                _drop(gauge, (gone,))

    # -- transfers (the load scraper's callback) ----------------------------------------------------------------------

    def also_count_transfers(
        self, observer: Callable[[TransferSample], None] | None
    ) -> Callable[[TransferSample], None]:
        """The load scraper's ``on_transfers`` callback: ``observer`` (the cost model's) first, then ``transfers``."""

        def both(sample: TransferSample) -> None:
            if observer is not None:
                observer(sample)
            self.transfers(sample)

        return both

    def transfers(self, sample: TransferSample) -> None:
        worker = self._pool.get(sample.worker_id)
        model = worker.model if worker is not None else ""
        m.KV_TRANSFERS.labels(model, sample.worker_id).inc(max(0.0, sample.transfers))
        m.KV_TRANSFER_SECONDS.labels(model, sample.worker_id).inc(max(0.0, sample.seconds))
        m.KV_TRANSFER_TOKENS.labels(model, sample.worker_id).inc(max(0.0, sample.tokens))
        m.KV_TRANSFER_BYTES.labels(model, sample.worker_id).inc(max(0.0, sample.bytes))


def _worker_labels(worker_id: str, labels: tuple[str, str, str]) -> tuple[str, str, str]:
    return labels[0], labels[1], worker_id


def _drop(gauge: Gauge, labels: tuple[str, ...]) -> None:
    gauge.labels(*labels).set(0)
    _remove(gauge, labels)


def _remove(metric: Gauge | Counter, labels: tuple[str, ...]) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass
