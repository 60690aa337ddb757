"""KVRouter: KV-aware routing's composition root, and the pipeline's context provider when ``kv_routing.enabled``.

It owns the stateful parts (prefix index, event subscriptions, load scraper, disaggregation estimates) and provides,
for the route planner (``routing/route_plan.py``), what the scorers and the remote-or-local decision need. It selects
nothing itself::

    prompt()     tokens -> chained block hashes                    (async: may tokenize in a thread / HTTP)
    context()    cached tokens per candidate (one index query per block size) + load snapshots  (no state change)
    decide()     remote or local prefill (DisaggDecider)                                         (no state change)
    observe()    record a plan: predicted / approximate index entries; the remote prefill's measured time; the path
                 it took (``DisaggDecider.dispatched``: requests one way in a row age the other way's lines)
    decider      DisaggDecider; observe_transfers is fed from the scraped NIXL counters
    decode_watch each request's decode worker timed from the proxy (``decode_watch.py``): the controller reports
                 streamed chunks; first tokens feed the decider's local and remote-tail lines, gaps its stall fit
    prefill_seen a request's prefill seen over in its decode worker's KV events (``prefill_seen.py``): its prompt
                 stops counting as queued there, streamed or not (polled every ``PREFILL_POLL_S``)

Lifecycle: ``sync(pool)`` on every discovery snapshot (adds and removes workers: index slots, one event subscriber
per worker with ``kv_events_endpoint`` in precise mode, scrape targets); ``start()`` once in the event loop (load
scraper, index maintenance); ``stop()`` at shutdown. ``sync`` may be called before ``start``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import zmq.asyncio

from litellm_disagg.engines import engine_for
from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.kv.block_hash import PromptBlocks
from litellm_disagg.routing.kv.decode_watch import DecodeWatch
from litellm_disagg.routing.kv.disagg_decision import DisaggDecider, DisaggDecision, DisaggInputs, LinearEstimate
from litellm_disagg.routing.kv.event_applier import ApplierStats, EventApplier
from litellm_disagg.routing.kv.event_subscriber import BadEndpoint, KVEventSubscriber
from litellm_disagg.routing.kv.in_flight_prefix import usable_now
from litellm_disagg.routing.kv.live_sessions import LiveSessions, NextTurns
from litellm_disagg.routing.kv.load_scraper import LoadScraper, TransferSample
from litellm_disagg.routing.kv.prefill_progress import PrefillProgress
from litellm_disagg.routing.kv.prefill_seen import PrefillSeen
from litellm_disagg.routing.kv.prefix_index import IndexStats, PrefixIndex
from litellm_disagg.routing.kv.settings import KVRoutingSettings
from litellm_disagg.routing.kv.tokenizer import PromptTokenizer
from litellm_disagg.routing.pipeline.context import LoadCache, ScoringContext, usable_cached_tokens
from litellm_disagg.routing.pipeline.selection import Selection
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.runtime_config import RuntimeConfig
from litellm_disagg.tasks import cancel

if TYPE_CHECKING:
    from litellm_disagg.routing.route_plan import RoutePlan

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY_BLOCKS = 65_536
"""Index bound for a worker that publishes no KV capacity (``kv_capacity_blocks`` 0)."""

PREFILL_POLL_S = 0.05
"""How often the calls awaiting their prefill's last block are checked against the index (``prefill_seen.py``)."""


@dataclass(frozen=True)
class _Indexed:
    """What the index's treatment of a worker depends on; a change re-creates its entries."""

    started_at: float
    block_size: int
    capacity: int
    events_endpoint: str | None


class KVRouter:
    def __init__(
        self,
        settings: KVRoutingSettings,
        *,
        accounting: Accounting | None = None,
        http_client: httpx.AsyncClient | None = None,
        worker_headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``http_client``: the client for the load scraper and the tokenizer's ``/tokenize`` fallback (tests' mock
        transports); without one, each uses its own (the scraper aiohttp's: a quarter of httpx's CPU per page), both
        sending ``worker_headers`` (the worker key) to the workers."""
        self.settings = settings
        self.accounting = (
            accounting if accounting is not None else Accounting(max_age_s=settings.load.inflight_max_age_s, clock=clock)
        )
        self.index = PrefixIndex(predicted_ttl_s=settings.index.predicted_ttl_s, clock=clock)
        self.sessions = LiveSessions(settings.decode.sessions, clock=clock)
        """Prefixes each decode worker served recently (the ``live_sessions`` scorer's input)."""
        self.decider = DisaggDecider(settings.disaggregation)
        self.decode_watch = DecodeWatch(self.decider, max_age_s=settings.load.inflight_max_age_s, clock=clock)
        self.prefill_seen = PrefillSeen()
        """Calls whose prefill ends when their decode worker's events show the prompt's last block."""
        self.progress: PrefillProgress | None = None
        """How far each worker has got through the prompts sent it (``load.prefill_progress``): the scoring context's
        ``prefill_computed``."""
        if settings.load.prefill_progress and self.accounting.prefill_watcher is None:
            d = settings.disaggregation
            self.progress = PrefillProgress(
                LinearEstimate(d.prior_prefill_overhead_s, d.prior_prefill_tokens_per_s),
                halflife_observations=d.halflife_observations,
            )
            self.accounting.prefill_watcher = self.progress
        self._clock = clock
        self.tokenizer = PromptTokenizer(settings.tokenizer, client=http_client, headers=worker_headers)
        self._tp_sizes: dict[str, int] = {}
        self._models: dict[str, str] = {}
        """Each worker's served model, for ``answered``."""
        self._block_sizes: frozenset[int] = frozenset()
        """The workers' block sizes: a remembered turn's block hashes are computed for these (``answered``)."""
        self.scraper = LoadScraper(
            interval_s=settings.load.scrape_interval_s,
            timeout_s=settings.load.scrape_timeout_s,
            stale_after_s=settings.load.stale_after_s,
            client=http_client,
            headers=worker_headers,
            clock=clock,
            on_transfers=self._transfers_measured,
            counted=self.accounting.requests if settings.load.advance_scrapes else None,
        )
        self._loads = LoadCache(self.accounting, self.scraper)
        """The load snapshot and its figures, kept between decisions while neither source changed."""
        self._indexed: dict[str, _Indexed] = {}
        self._subscribers: dict[str, KVEventSubscriber] = {}
        self._zmq: zmq.asyncio.Context | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        for subscriber in self._subscribers.values():
            subscriber.start()
        self.scraper.start()
        self._spawn(self._maintain(), "kv-index-maintenance")
        self._spawn(self._watch_prefills(), "kv-prefill-seen")

    async def stop(self) -> None:
        self._started = False
        await cancel(list(self._tasks))
        await asyncio.gather(*(s.stop() for s in self._subscribers.values()))
        self._subscribers.clear()
        await self.scraper.stop()
        await self.tokenizer.aclose()
        if self._zmq is not None:
            self._zmq.destroy(linger=0)  # closes any socket a cancelled stop left open
            self._zmq = None

    def sync(self, pool: WorkerPool) -> None:
        """Follow a discovery snapshot: index, subscribe to and scrape exactly the workers it lists."""
        present = {w.worker_id: w for w in pool.workers}
        for worker_id in [wid for wid in self._indexed if wid not in present]:
            self._forget(worker_id)
        for worker in pool.workers:
            want = self._treatment(worker)
            if self._indexed.get(worker.worker_id) != want:
                if worker.worker_id in self._indexed:
                    self._forget(worker.worker_id)
                self._add(worker, want)
        self.scraper.set_targets(
            {w.worker_id: w.server_url for w in pool.workers},
            metrics={w.worker_id: engine_for(w).adapter.metrics for w in pool.workers},
        )
        self._tp_sizes = {w.worker_id: w.tensor_parallel_size for w in pool.workers}
        self._models = {w.worker_id: w.model for w in pool.workers}
        self._block_sizes = frozenset(w.block_size for w in pool.workers)

    # -- per request --------------------------------------------------------------------------------------------------

    async def prompt(self, request: DisaggRequest, candidates: Sequence[RuntimeConfig]) -> PromptBlocks | None:
        """The request's tokens and block hashes, or None when they cannot be known (route on load alone).
        Without a local tokenizer, a worker's /tokenize is asked: spread over the candidates, not always the first."""
        if not candidates:
            return None
        asked = candidates[zlib.crc32(request.request_id.encode()) % len(candidates)]
        tokens = await self.tokenizer.tokenize_prompt(
            model=asked.model, endpoint=request.endpoint, fields=request.fields, worker_url=asked.server_url
        )
        if tokens is None:
            return None
        if tokens.prefix is not None:  # a remembered turn and what follows, kept apart (no 8k-id join on the path)
            return PromptBlocks.after(tokens.prefix, tokens.tail)
        return PromptBlocks(tokens.ids)

    async def answered(self, worker_id: str | None, fields: Mapping[str, Any], answer: str) -> int:
        """A chat request (``fields``) served by ``worker_id`` completed with ``answer``: its segments go into the
        token cache (``PromptTokenizer.remember_answer``), so the conversation's next turn encodes only its new
        question. Returns the segments encoded; 0 for a worker not known here."""
        model = self._models.get(worker_id) if worker_id is not None else None
        if model is None:
            return 0
        return await self.tokenizer.remember_answer(
            model=model, fields=fields, answer=answer, block_sizes=self._block_sizes
        )

    def context(self, prompt: PromptBlocks | None, candidates: Sequence[RuntimeConfig]) -> ScoringContext:
        """Cached tokens per candidate (one index query per distinct block size; a second, of held blocks only, where
        a candidate's predicted blocks may still be being computed or pulled: ``in_flight_prefix.py``) and their
        loads."""
        loads, figures = self._loads.snapshot(candidates)
        cached: dict[str, int] = {}
        if prompt is not None and prompt.num_tokens:
            by_size: dict[int, dict[str, int]] = {}
            held_by_size: dict[int, dict[str, int]] = {}
            for worker in candidates:
                size = worker.block_size
                overlap = by_size.get(size)
                if overlap is None:
                    overlap = by_size[size] = self.index.overlap(prompt.hashes(size))
                blocks = overlap.get(worker.worker_id, 0)
                if not blocks:
                    continue
                tokens = usable_cached_tokens(blocks, size, prompt.num_tokens)
                load = loads[worker.worker_id]
                inflight = load.inflight_prefill_tokens + load.inflight_pull_tokens
                if inflight > 0 and self.index.has_predictions:
                    held = held_by_size.get(size)
                    if held is None:
                        held = held_by_size[size] = self.index.overlap(prompt.hashes(size), predicted=False)
                    held_tokens = usable_cached_tokens(held.get(worker.worker_id, 0), size, prompt.num_tokens)
                    tokens = usable_now(tokens, held_tokens, inflight)
                if tokens:
                    cached[worker.worker_id] = tokens
        return ScoringContext(
            prompt_tokens=0 if prompt is None else prompt.num_tokens,
            cached_tokens=cached,
            loads=loads,
            live_sessions=self.sessions.counts(),
            next_turns=self._next_turns(prompt),
            figures=figures,
            prefill_computed=self.progress.computed_all(self._clock()) if self.progress is not None else None,
            replica=self.accounting.replica_slot,
        )

    def _next_turns(self, prompt: PromptBlocks | None) -> Mapping[str, float] | None:
        """With ``decode.sessions.expect: next_turns``: the next turns each worker is expected to get while this
        prompt's prefill would run there (its prefill time by the prefill progress line, else the decision's prior
        prefill line), computed on first read. None with ``count``."""
        if self.settings.decode.sessions.expect == "count":
            return None
        line = (self.progress.line.estimate() if self.progress is not None
                else self.decider.prefill.prior)
        return NextTurns(self.sessions, line.seconds(prompt.num_tokens if prompt is not None else 0))

    def decide(self, prompt: PromptBlocks | None, decode: Selection, prefill: Selection) -> DisaggDecision:
        """Remote prefill on ``prefill``'s choice, or local prefill on ``decode``'s choice."""
        decode_id, prefill_id = decode.worker_id, prefill.worker_id
        if decode_id is None:
            return DisaggDecision(False, "no decode worker")
        decode_b = decode.detail(decode_id)
        prefill_b = prefill.detail(prefill_id) if prefill_id is not None else None
        return self.decider.decide(
            DisaggInputs(
                prompt_tokens=0 if prompt is None else prompt.num_tokens,
                decode_cached_tokens=decode_b.cached_tokens,
                prefill_cached_tokens=0 if prefill_b is None else prefill_b.cached_tokens,
                prefill_queued_tokens=0 if prefill_id is None else self.accounting.prefill_tokens(prefill_id),
                decode_queued_tokens=self.accounting.prefill_tokens(decode_id),
                decode_running=decode_b.active_requests,
                prefill_available=prefill_id is not None,
            )
        )

    def observe(
        self, plan: RoutePlan, prefill_worker_id: str | None, prefill_seconds: float | None, *,
        call_id: str | None = None,
    ) -> None:
        """Where the prompt's blocks now live (until events confirm it), and what the remote prefill cost; with
        ``call_id``, its stream is timed (``decode_watch``) for the path it took."""
        inputs = plan.decision_inputs
        if inputs is not None:  # a priced request, sent: the other path's lines age (``DisaggDecider.dispatched``)
            self.decider.dispatched(local=prefill_worker_id is None)
        if call_id is not None and inputs is not None and inputs.prompt_tokens:
            self.decode_watch.dispatched(
                call_id,
                local=prefill_worker_id is None,
                tokens=inputs.prompt_tokens - inputs.decode_cached_tokens,
                queued_tokens=inputs.decode_queued_tokens,
                worker_id=plan.decode.worker_id,
                prefill_worker_id=prefill_worker_id,
            )
        prompt = plan.prompt
        if call_id is not None and prompt is not None and self.index.is_precise(plan.decode.worker_id):
            hashes = prompt.hashes(plan.decode.block_size)
            self.prefill_seen.sent(call_id, plan.decode.worker_id, hashes[-1] if hashes else None, self.index.holds)
        self.routed(prompt, plan.decode)
        if prompt is not None and prompt.num_tokens:
            self.sessions.routed(plan.decode.worker_id, prompt.hashes(plan.decode.block_size), call_id=call_id)
        if prefill_worker_id is None or prompt is None:
            return
        prefill = next((p for p in plan.prefill_order if p.worker_id == prefill_worker_id), None)
        if prefill is not None:
            self.routed(prompt, prefill)
        if prefill_seconds is not None:
            computed = prompt.num_tokens - plan.cached_tokens.get(prefill_worker_id, 0)
            self.decider.observe_prefill(max(computed, 1), prefill_seconds)

    def prefills_seen(self) -> list[str]:
        """The calls whose decode worker now holds their prompt's last block: their prefill is over there, so their
        prompt stops counting as queued or in transfer (``Accounting.prefill_done``) and a local one as prefilling
        (``DecodeWatch.prefill_over``). Called every ``PREFILL_POLL_S``; returns the calls."""
        done = self.prefill_seen.done(self.index.holds)
        for call_id in done:
            self.accounting.prefill_done(FlightKey.decode(call_id))
            self.decode_watch.prefill_over(call_id)
        return done

    def routed(self, prompt: PromptBlocks | None, worker: RuntimeConfig) -> None:
        """A request with this prompt was sent to ``worker`` (its prefill or decode): until the worker's events
        confirm it (precise) or for the TTL (approximate), the worker counts as holding the prompt's blocks."""
        if prompt is not None and prompt.num_tokens:
            self.index.record_routed(worker.worker_id, prompt.hashes(worker.block_size))

    # -- introspection ------------------------------------------------------------------------------------------------

    def index_stats(self) -> IndexStats:
        return self.index.stats()

    def event_stats(self) -> dict[str, ApplierStats]:
        return {wid: s.applier.stats for wid, s in self._subscribers.items()}

    # -- internals ----------------------------------------------------------------------------------------------------

    def _treatment(self, worker: RuntimeConfig) -> _Indexed:
        capacity = self.settings.index.max_blocks_per_worker or worker.kv_capacity_blocks or DEFAULT_CAPACITY_BLOCKS
        precise = self.settings.index.mode == "precise" and worker.kv_events_endpoint is not None
        return _Indexed(worker.started_at, worker.block_size, capacity, worker.kv_events_endpoint if precise else None)

    def _add(self, worker: RuntimeConfig, how: _Indexed) -> None:
        endpoint = how.events_endpoint
        subscriber: KVEventSubscriber | None = None
        if endpoint is not None:
            events = self.settings.events
            applier = EventApplier(
                worker.worker_id,
                self.index,
                block_size=how.block_size,
                capacity_blocks=how.capacity,
                media=(*events.media, None),
                kv_group=events.kv_group,
                on_gap=events.on_gap,
            )
            try:
                subscriber = KVEventSubscriber(
                    endpoint,
                    applier,
                    decode=engine_for(worker).adapter.decode_kv_events,
                    wire=engine_for(worker).adapter.kv_event_wire,
                    context=self._context(),
                    topic=events.topic,
                    rcvhwm=events.rcvhwm,
                    reconnect_interval_s=events.reconnect_interval_s,
                    reconnect_interval_max_s=events.reconnect_interval_max_s,
                    heartbeat_s=events.heartbeat_s,
                )
            except BadEndpoint as exc:
                logger.warning("worker %s: %s; indexing it approximately", worker.worker_id, exc)
                how = _Indexed(how.started_at, how.block_size, how.capacity, None)
        ttl = None if subscriber is not None else self.settings.index.approximate_ttl_s
        self.index.add_worker(worker.worker_id, capacity_blocks=how.capacity, ttl_s=ttl)
        self._indexed[worker.worker_id] = how
        if subscriber is not None:
            self._subscribers[worker.worker_id] = subscriber
            if self._started:
                subscriber.start()

    def _forget(self, worker_id: str) -> None:
        self._indexed.pop(worker_id, None)
        self.sessions.forget(worker_id)
        self.prefill_seen.forget(worker_id)
        if self.progress is not None:
            self.progress.forget(worker_id)
        self.index.remove_worker(worker_id)
        subscriber = self._subscribers.pop(worker_id, None)
        if subscriber is None:
            return
        if subscriber.running:
            self._spawn(subscriber.stop(), f"kv-events-stop-{worker_id}")
        else:
            subscriber.close()

    def _transfers_measured(self, sample: TransferSample) -> None:
        """A worker's NIXL counters moved (load_scraper): vLLM counts one transfer per TP rank of the decode side."""
        self.decider.observe_transfers(
            transfers=sample.transfers,
            seconds=sample.seconds,
            tokens=sample.tokens,
            handles_per_request=self._tp_sizes.get(sample.worker_id, 1),
        )

    def _context(self) -> zmq.asyncio.Context:
        if self._zmq is None:
            self._zmq = zmq.asyncio.Context()
        return self._zmq

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _maintain(self) -> None:
        interval = self.settings.index.maintain_interval_s
        budget = self.settings.index.maintain_max_items
        while True:
            await asyncio.sleep(interval)
            try:
                self.index.maintain(max_items=budget)
            except Exception:  # maintenance must never stop
                logger.exception("prefix index maintenance failed")

    async def _watch_prefills(self) -> None:
        while True:
            await asyncio.sleep(PREFILL_POLL_S)
            if not len(self.prefill_seen):
                continue
            try:
                self.prefills_seen()
            except Exception:  # a bookkeeping error must never stop the watch
                logger.exception("checking prefills against KV events failed")
