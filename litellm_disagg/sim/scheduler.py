"""Continuous batching over the paged KV cache, as vLLM v1 does it. No I/O and no clock of its own.

One engine step is ``schedule()`` (decide what the batch computes; may allocate, evict, preempt), the step's
simulated time, then ``complete(step, now)`` (advance the requests, cache their full blocks, sample a token for every
request that caught up, finish the done ones). Between the two, other code may ``abort`` requests; ``complete``
ignores them.

``schedule`` order, under a token budget per step (chunked prefill):

1. running requests, oldest first: the rest of a prompt (a chunk of it) or one decode token. When a request needs a
   block and none is free, the newest running request is preempted (its blocks freed, its progress lost, queued
   again at the head; recompute mode);
2. unless something was preempted: requests whose remote KV arrived (or failed, then they compute it themselves);
3. waiting requests, first come first served, while the batch has room and their blocks fit (prefix-cache hits are
   taken, not recomputed). A decode request with remote KV gets blocks for its whole prompt and starts pulling
   (listed in ``step.transfers``); it joins the batch when ``remote_kv_loaded``/``remote_kv_failed`` is called.

Prefill side of the NIXL protocol: a finished ``do_remote_decode`` request keeps its blocks in a ``Lease`` until
``release_lease`` (the decode pulled them) or ``expire_leases``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from litellm_disagg.sim.kv_cache import BlockPool
from litellm_disagg.sim.request import FinishReason, Lease, RequestStatus, SimRequest
from litellm_disagg.sim.settings import EngineSettings
from litellm_disagg.sim.stats import EngineStats
from litellm_disagg.sim.timing import StepWork


@dataclass
class ScheduledStep:
    scheduled: list[tuple[SimRequest, int]] = field(default_factory=list)
    """(request, tokens it computes this step), in batch order."""
    transfers: list[SimRequest] = field(default_factory=list)
    """Decode requests that got their blocks this step and must now pull their prompt's KV."""
    preempted: list[SimRequest] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_seqs: int = 0

    def add(self, req: SimRequest, n: int) -> None:
        self.scheduled.append((req, n))
        if n == 1 and req.num_computed_tokens == req.num_tokens - 1:
            self.decode_seqs += 1  # one token, then a sample: a decode step for this sequence
        else:
            self.prefill_tokens += n

    @property
    def work(self) -> StepWork:
        return StepWork(prefill_tokens=self.prefill_tokens, decode_seqs=self.decode_seqs)


@dataclass(frozen=True)
class RequestOutput:
    request: SimRequest
    new_token_ids: list[int]
    finished: bool
    lease: Lease | None = None
    """Prefill side: the blocks held for the decode (set when a ``do_remote_decode`` request finishes)."""


class Scheduler:
    def __init__(
        self,
        settings: EngineSettings,
        pool: BlockPool,
        stats: EngineStats | None = None,
        *,
        hold_for_remote_decode: bool = True,
        pull_remote_kv: bool = True,
    ):
        self.settings = settings
        self.pool = pool
        self.stats = stats or EngineStats()
        self.hold_for_remote_decode = hold_for_remote_decode
        """Whether this engine honours ``do_remote_decode`` (prefill-capable roles)."""
        self.pull_remote_kv = pull_remote_kv
        """Whether this engine honours ``do_remote_prefill`` (decode-capable roles)."""
        self.block_size = pool.block_size
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.pulling: dict[str, SimRequest] = {}
        self.ready: deque[SimRequest] = deque()
        self.leases: dict[str, Lease] = {}
        self._requests: dict[str, SimRequest] = {}

    # -- state -------------------------------------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Queued, pulling remote KV, or ready to join: what vLLM reports as waiting."""
        return len(self.waiting) + len(self.pulling) + len(self.ready)

    @property
    def idle(self) -> bool:
        return not self._requests

    def get(self, request_id: str) -> SimRequest | None:
        return self._requests.get(request_id)

    # -- requests ----------------------------------------------------------------------------------------------------

    def add(self, req: SimRequest) -> None:
        if req.request_id in self._requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        if req.max_output_tokens < 1 or req.num_prompt_tokens + req.max_output_tokens > self.settings.max_model_len:
            raise ValueError("request exceeds max_model_len")
        if not self.pull_remote_kv:
            req.remote = None
        if not self.hold_for_remote_decode:
            req.do_remote_decode = False
        self._requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, request_id: str) -> SimRequest | None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING_FOR_REMOTE_KV:
            self.pulling.pop(request_id, None)
        elif req in self.ready:
            self.ready.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._free(req)
        req.status = RequestStatus.ABORTED
        req.finish_reason = "abort"
        self.stats.request_success["abort"] += 1
        return req

    # -- one step ----------------------------------------------------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        budget = self.settings.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._grow(req, n, step):
                break  # req itself was preempted: everything after it was too
            step.add(req, n)
            budget -= n
            i += 1
        if step.preempted:
            return step
        while self.ready and budget > 0 and len(self.running) < self.settings.max_num_seqs:
            req = self.ready[0]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            need = self._blocks_for(req.num_computed_tokens + n) - len(req.block_ids)
            if need > 0:
                new = self.pool.allocate(need)
                if new is None:
                    break
                req.block_ids.extend(new)
            self.ready.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            step.add(req, n)
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.settings.max_num_seqs:
            req = self.waiting[0]
            if req.remote is not None and not req.prompt_stats_done:
                if not self._admit_remote(req):
                    break
                self.waiting.popleft()
                step.transfers.append(req)
                continue
            chunk = self._admit(req, budget)
            if chunk is None:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            step.add(req, chunk)
            budget -= chunk
        return step

    def complete(self, step: ScheduledStep, now: float) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        self.stats.steps += 1
        for req, n in step.scheduled:
            if req.status is not RequestStatus.RUNNING:
                continue  # aborted during the step
            req.num_computed_tokens += n
            self._cache_blocks(req)
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prompt chunk: nothing to sample yet
            token = req.model.next_token()
            eos = req.natural_stop_mean is not None and req.model.ends_after_next(req.natural_stop_mean)
            req.append_output(token)
            self.stats.generation_tokens += 1
            if len(req.output_token_ids) < req.max_output_tokens and not eos:
                outputs.append(RequestOutput(req, [token], finished=False))
                continue
            reason: FinishReason = "stop" if eos else req.limit_reason
            outputs.append(RequestOutput(req, [token], finished=True, lease=self._finish(req, now, reason)))
        return outputs

    # -- remote KV (decode side) -------------------------------------------------------------------------------------

    def remote_kv_loaded(self, request_id: str) -> None:
        """The prompt's KV arrived: all of it is computed but the last token, which the next step recomputes to
        sample from (as vLLM does)."""
        req = self.pulling.pop(request_id, None)
        if req is None:
            return
        req.num_external_tokens = req.num_prompt_tokens - req.num_local_hit_tokens
        self.stats.prompt_tokens_external_kv_transfer += req.num_external_tokens
        req.num_computed_tokens = req.num_prompt_tokens - 1
        self._cache_blocks(req)
        req.status = RequestStatus.WAITING
        self.ready.append(req)

    def remote_kv_failed(self, request_id: str) -> None:
        """The pull failed (engine gone, blocks expired): compute the prompt here (kv_load_failure_policy=recompute)."""
        req = self.pulling.pop(request_id, None)
        if req is None:
            return
        self.stats.prompt_tokens_local_compute += req.num_prompt_tokens - req.num_local_hit_tokens
        req.status = RequestStatus.WAITING
        self.ready.append(req)

    # -- leases (prefill side) ---------------------------------------------------------------------------------------

    def lease(self, request_id: str) -> Lease | None:
        return self.leases.get(request_id)

    def release_lease(self, request_id: str) -> bool:
        lease = self.leases.pop(request_id, None)
        if lease is None:
            return False
        self.pool.free(lease.block_ids)
        return True

    def expire_leases(self, now: float) -> int:
        expired = [rid for rid, lease in self.leases.items() if lease.expires_at <= now]
        for rid in expired:
            self.release_lease(rid)
        self.stats.kv_leases_expired += len(expired)
        return len(expired)

    def next_lease_expiry(self) -> float | None:
        return min((lease.expires_at for lease in self.leases.values()), default=None)

    # -- internals ---------------------------------------------------------------------------------------------------

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _grow(self, req: SimRequest, n: int, step: ScheduledStep) -> bool:
        """Give ``req`` the blocks for ``n`` more tokens, preempting the newest running requests if needed."""
        need = self._blocks_for(req.num_computed_tokens + n) - len(req.block_ids)
        while need > 0:
            new = self.pool.allocate(need)
            if new is not None:
                req.block_ids.extend(new)
                return True
            victim = self.running.pop()
            self._preempt(victim)
            step.preempted.append(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: SimRequest) -> None:
        self._free(req)
        req.num_computed_tokens = 0
        req.num_cached_blocks = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)
        self.stats.num_preemptions += 1

    def _cached_prefix(self, req: SimRequest, num_tokens: int) -> int:
        """Cached leading blocks usable for the first ``num_tokens`` of ``req``, leaving at least one to compute."""
        hashes = req.hashes(self.block_size)
        return self.pool.cached_prefix(hashes[: min(len(hashes), (num_tokens - 1) // self.block_size)])

    def _count_lookup(self, num_tokens: int, hit_blocks: int) -> None:
        self.stats.prefix_cache_queries += num_tokens
        self.stats.prefix_cache_hits += hit_blocks * self.block_size

    def _admit(self, req: SimRequest, budget: int) -> int | None:
        """Take cached blocks and allocate new ones for a waiting request's first chunk; its chunk size, or None."""
        hashes = req.hashes(self.block_size)
        hit = self._cached_prefix(req, req.num_tokens)
        hit_tokens = hit * self.block_size
        n = min(req.num_tokens - hit_tokens, budget)
        need = self._blocks_for(hit_tokens + n) - hit
        if not self.pool.can_allocate(hashes[:hit], need):
            return None
        self._count_lookup(req.num_tokens, hit)  # counted only when admitted
        ids = self.pool.take_cached(hashes[:hit])
        new = self.pool.allocate(need)
        assert new is not None
        req.block_ids = ids + new
        req.num_cached_blocks = hit
        req.num_computed_tokens = hit_tokens
        if not req.prompt_stats_done:
            req.prompt_stats_done = True
            req.num_local_hit_tokens = min(hit_tokens, req.num_prompt_tokens)
            self.stats.prompt_tokens_local_cache_hit += req.num_local_hit_tokens
            self.stats.prompt_tokens_local_compute += req.num_prompt_tokens - req.num_local_hit_tokens
        return n

    def _admit_remote(self, req: SimRequest) -> bool:
        """Blocks for the whole prompt (local prefix hits taken), then the pull starts."""
        hashes = req.hashes(self.block_size)
        hit = self._cached_prefix(req, req.num_prompt_tokens)
        need = self._blocks_for(req.num_prompt_tokens) - hit
        if not self.pool.can_allocate(hashes[:hit], need):
            return False
        self._count_lookup(req.num_prompt_tokens, hit)
        ids = self.pool.take_cached(hashes[:hit])
        new = self.pool.allocate(need)
        assert new is not None
        req.block_ids = ids + new
        req.num_cached_blocks = hit
        req.num_computed_tokens = hit * self.block_size
        req.prompt_stats_done = True
        req.num_local_hit_tokens = req.num_computed_tokens
        self.stats.prompt_tokens_local_cache_hit += req.num_local_hit_tokens
        req.status = RequestStatus.WAITING_FOR_REMOTE_KV
        self.pulling[req.request_id] = req
        return True

    def _cache_blocks(self, req: SimRequest) -> None:
        full = req.num_computed_tokens // self.block_size
        start = req.num_cached_blocks
        if full <= start:
            return
        hashes = req.hashes(self.block_size)
        bs = self.block_size
        self.pool.cache_full_blocks(
            req.block_ids[start:full],
            hashes[start:full],
            hashes[start - 1] if start else None,
            req.all_token_ids[start * bs : full * bs],
        )
        req.num_cached_blocks = full

    def _finish(self, req: SimRequest, now: float, reason: FinishReason) -> Lease | None:
        self.running.remove(req)
        self._requests.pop(req.request_id, None)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self.stats.request_success[reason] += 1
        if req.do_remote_decode and req.block_ids:
            lease = Lease(
                req.request_id, req.block_ids, tuple(req.prompt_token_ids), now + self.settings.kv_lease_timeout_s
            )
            self.leases[req.request_id] = lease
            req.block_ids = []
            return lease
        self._free(req)
        return None

    def _free(self, req: SimRequest) -> None:
        if req.block_ids:
            self.pool.free(req.block_ids)
            req.block_ids = []
        req.num_cached_blocks = 0
