"""One simulated worker: vLLM-v1-style continuous batching over a block-counted KV cache. Pure; no clock of its own.

The step cost is ``litellm_disagg.sim.timing.TimingModel`` (the HTTP simulator's model, the same figures), so a step
here and a step of a ``litellm_disagg.sim`` worker take the same simulated time::

    step_time = max(weight_read_s, prefill_tokens / prefill_tokens_per_s) + decode_seqs * per_seq_s

What a step computes (``schedule``), under a token budget (``max_num_batched_tokens``, chunked prefill) and a batch
limit (``max_num_seqs``):

1. every decoding request: one token (decodes first, as vLLM's chunked prefill prioritises them; with
   ``max_num_seqs`` below the token budget they always fit). A request that needs a block when none is free preempts
   the newest running request (its blocks freed, recomputed later from scratch, recompute mode);
2. running prompts, oldest first: their next chunk;
3. requests whose KV arrived (decode side of a transfer): they join and recompute the prompt's last token;
4. queued prompts (preempted requests first), first come first served, while their first chunk's blocks fit;
5. queued pulls (decode side of a transfer), first come first served, while the whole prompt's blocks fit, unless
   a queued prompt is still waiting: they take their blocks here and their transfer starts (``plan.pulls``).

A step that had to preempt admits nothing new (as ``litellm_disagg/sim/scheduler.py``), pulls included. That is
vLLM's order (``vllm/v1/core/sched/scheduler.py``, vLLM 0.32: running requests take their blocks first, and the
waiting queue, where a request whose KV is remote gets its blocks and starts its load, is visited only when the step
preempted nothing), so a pull never takes the blocks a running decode needs next. Until 2026-12-02 pulls took
their blocks whenever they fitted, between steps, ahead of the running decodes (docs/planner-evaluation.md,
"Pulls admitted in the step"). Decoding requests are not
visited one by one per step: each keeps the worker's decode-step count at which it joined, and events keyed by that
count (its next block, its last token) do the work, so a step costs its events, not its batch size.

Aggregated workers (``both``) mix prefill chunks and decode tokens in one step, so a long prompt stretches every
co-running request's inter-token latency; prefill workers run prefill-only batches; decode workers decode.

What this leaves out of ``litellm_disagg/sim``: prefix caching (every prompt here is unique), token contents. The
KV cache counts blocks: a decode worker admits a pull only when the whole prompt's blocks are free (a hard limit:
requests wait), and grows each request block by block as it decodes.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim.settings import EngineSettings
from litellm_disagg.sim.timing import StepWork, TimingModel


class Phase(Enum):
    QUEUED = "queued"
    """Waiting for its prompt to be computed (locally, or on a prefill worker)."""
    PREFILLING = "prefilling"
    PREFILLED = "prefilled"
    """Prompt computed on a prefill worker; its KV is held there until the decode worker pulled it."""
    PULL_QUEUED = "pull_queued"
    """On its decode worker, waiting for blocks to pull the KV into."""
    PULLING = "pulling"
    READY = "ready"
    """KV arrived; joins the decode batch."""
    DECODING = "decoding"
    DONE = "done"


@dataclass(eq=False)
class Req:
    rid: int
    arrival: float
    prompt: int
    output: int
    phase_name: str
    remote: bool = False
    """Prefilled on another worker (disaggregated)."""
    computed: int = 0
    """Tokens whose KV exists on the worker that runs it now."""
    generated: int = 0
    blocks: int = 0
    """Blocks held on the worker that runs it now."""
    state: Phase = Phase.QUEUED
    prefill_worker: str | None = None
    decode_worker: str = ""
    first_token: float | None = None
    finish: float | None = None
    prefill_done: float | None = None
    transfer_s: float = 0.0
    preemptions: int = 0
    held_blocks: int = 0
    """Prefill side: the blocks its computed prompt holds until the pull."""
    tick0: int = 0
    """Decoding: the worker's decode-step count when it (re)joined the batch, with ``gen0`` tokens generated."""
    gen0: int = 0
    seq: int = 0
    """Order of joining the running batch on its current worker (the newest is preempted first)."""

    @property
    def total(self) -> int:
        return self.prompt + self.generated

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def itl(self) -> float | None:
        """Mean inter-token latency (DistServe's TPOT): decode time over the tokens after the first."""
        if self.finish is None or self.first_token is None or self.output < 2:
            return None if self.finish is None else 0.0
        return (self.finish - self.first_token) / (self.output - 1)


@dataclass
class StepPlan:
    items: list[tuple[Req, int]] = field(default_factory=list)
    """Prompt chunks: (request, tokens)."""
    joining: list[Req] = field(default_factory=list)
    """Requests whose KV arrived: this step recomputes their last prompt token and samples their first token."""
    prefill_tokens: int = 0
    decode_seqs: int = 0
    duration: float = 0.0
    pulls: list[Req] = field(default_factory=list)
    """Queued pulls this step gave their blocks to: their transfers start now (``start_transfers``)."""


@dataclass
class StepResult:
    first_tokens: list[Req] = field(default_factory=list)
    finished: list[Req] = field(default_factory=list)
    prefilled: list[Req] = field(default_factory=list)
    """Prompts computed for a remote decode (their KV is now held here)."""


class Worker:
    def __init__(self, worker_id: str, role: WorkerRole, engine: EngineSettings, timing: TimingModel):
        self.worker_id = worker_id
        self.role = role
        self.pending_role: WorkerRole | None = None
        self.flip_at: float | None = None
        self.engine = engine
        self.timing = timing
        self.block_size = engine.block_size
        self.capacity = engine.num_gpu_blocks
        self.free_blocks = engine.num_gpu_blocks
        self.queued: deque[Req] = deque()
        """Prompts to compute here (local serving, a prefill for a remote decode, or a recompute)."""
        self.pull_queue: deque[Req] = deque()
        self.ready: deque[Req] = deque()
        self.prefilling: list[Req] = []
        """Running prompts (chunked), oldest first."""
        self.decoding: dict[int, Req] = {}
        """Running decodes by request id, in joining order."""
        self.held: dict[int, Req] = {}
        """Prefill side: computed prompts whose KV waits for its pull."""
        self.pulling = 0
        self.busy_until: float | None = None
        self.link_free_at = 0.0
        """Its inbound KV link: pulls into this worker queue on it."""
        self.busy_s = 0.0
        self.queued_prefill_tokens = 0
        """Prompt tokens queued or being prefilled here (what the router's accounting tracks)."""
        self.tick = 0
        """Decode steps done (steps with at least one decoding request)."""
        self._events: list[tuple[int, int, int, Req]] = []
        """(tick, kind, join seq, request): kind 0 = needs its next block before that tick's step, 1 = its last
        token is sampled by that tick's step. Stale entries (request preempted or gone) are skipped."""
        self._seq = 0
        self._preempted = False

    # -- state --------------------------------------------------------------------------------------------------------

    @property
    def flipping(self) -> bool:
        return self.pending_role is not None

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.capacity

    @property
    def running(self) -> int:
        return len(self.decoding) + len(self.prefilling)

    @property
    def inflight(self) -> int:
        return len(self.queued) + len(self.pull_queue) + self.pulling + len(self.ready) + self.running

    @property
    def has_work(self) -> bool:
        return bool(self.decoding or self.prefilling or self.ready or self.queued or self.pull_queue)

    # -- requests ----------------------------------------------------------------------------------------------------

    def enqueue_prompt(self, req: Req) -> None:
        req.state = Phase.QUEUED
        self.queued.append(req)
        self.queued_prefill_tokens += req.total - req.computed

    def enqueue_pull(self, req: Req) -> None:
        req.state = Phase.PULL_QUEUED
        self.pull_queue.append(req)

    def admit_pulls(self) -> list[Req]:
        """Give queued pulls their blocks (the whole prompt's, FIFO: a pull that does not fit blocks the ones behind
        it), while the batch has room; ``schedule`` calls it after the running requests took theirs."""
        admitted: list[Req] = []
        while self.pull_queue and self.running < self.engine.max_num_seqs:
            req = self.pull_queue[0]
            need = self.blocks_for(req.prompt)
            if need > self.free_blocks:
                break
            self.pull_queue.popleft()
            self.free_blocks -= need
            req.blocks = need
            req.state = Phase.PULLING
            self.pulling += 1
            admitted.append(req)
        return admitted

    def start_transfers(self, reqs: list[Req], now: float) -> list[tuple[Req, float]]:
        """Start admitted pulls on the inbound link (one after another); returns (request, arrival time of its KV)."""
        started: list[tuple[Req, float]] = []
        for req in reqs:
            start = max(now, self.link_free_at)
            req.transfer_s = self.timing.transfer_time(req.prompt)
            done = start + req.transfer_s
            self.link_free_at = done
            started.append((req, done))
        return started

    def pull_done(self, req: Req) -> None:
        self.pulling -= 1
        req.computed = req.prompt - 1  # vLLM recomputes the last prompt token to sample from
        req.state = Phase.READY
        self.ready.append(req)

    def release_held(self, req: Req) -> None:
        if self.held.pop(req.rid, None) is not None:
            self.free_blocks += req.held_blocks
            req.held_blocks = 0

    # -- one step ----------------------------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self._preempted = False
        tick = self.tick
        events = self._events
        # 1. decodes: the blocks they need before this step (events at this tick), preempting the newest if none.
        while events and events[0][0] <= tick:
            _, kind, seq, req = events[0]
            if req.state is not Phase.DECODING or req.seq != seq:
                heapq.heappop(events)  # stale: preempted or finished since
                continue
            if kind == 1:
                break  # its last token is this step's (complete() ends it); same-tick block needs sort first
            heapq.heappop(events)
            if not self._take_block(req):
                continue  # req itself was preempted
            req.blocks += 1
            self._push_block_event(req)
        budget = self.engine.max_num_batched_tokens - len(self.decoding)
        plan.decode_seqs = len(self.decoding)
        # 2. running prompts, oldest first.
        i = 0
        while i < len(self.prefilling) and budget > 0:
            req = self.prefilling[i]
            n = min(req.total - req.computed, budget)
            need = self.blocks_for(req.computed + n) - req.blocks
            if need > 0 and not self._take_blocks(req, need):
                break  # req itself was preempted (and everything newer)
            plan.items.append((req, n))
            plan.prefill_tokens += n
            budget -= n
            i += 1
        if not self._preempted:
            max_seqs = self.engine.max_num_seqs
            # 3. requests whose KV arrived: recompute the last prompt token, sample the first.
            while self.ready and budget > 0 and self.running < max_seqs:
                req = self.ready.popleft()
                self._join_decoding(req, gen0=0, tick0=tick)
                plan.joining.append(req)
                plan.decode_seqs += 1
                budget -= 1
            # 4. queued prompts, first come first served (preempted requests first: they are at the front).
            while self.queued and budget > 0 and self.running < max_seqs:
                req = self.queued[0]
                n = min(req.total - req.computed, budget)
                need = self.blocks_for(req.computed + n) - req.blocks
                if need > self.free_blocks:
                    break
                self.free_blocks -= need
                req.blocks += need
                self.queued.popleft()
                req.state = Phase.PREFILLING
                req.seq = self._next_seq()
                self.prefilling.append(req)
                plan.items.append((req, n))
                plan.prefill_tokens += n
                budget -= n
            # 5. queued pulls, behind any queued prompt that did not fit (one waiting queue, first come first
            # served): their blocks now, after the running requests took theirs.
            if not self.queued and budget > 0:
                plan.pulls = self.admit_pulls()
        plan.duration = self.timing.step_time(StepWork(plan.prefill_tokens, plan.decode_seqs))
        return plan

    def complete(self, plan: StepPlan, now: float) -> StepResult:
        out = StepResult()
        tick = self.tick
        if plan.decode_seqs:
            self.tick += 1
        for req in plan.joining:
            req.first_token = now
            out.first_tokens.append(req)
        # Decodes that sampled their last token this step.
        events = self._events
        while events and events[0][0] <= tick:
            _, kind, seq, req = events[0]
            if kind == 0:
                if req.state is not Phase.DECODING or req.seq != seq:
                    heapq.heappop(events)
                    continue
                break  # a block needed by a later step (cannot be at this tick: handled in schedule)
            heapq.heappop(events)
            if req.state is not Phase.DECODING or req.seq != seq:
                continue
            self._finish(req, now)
            out.finished.append(req)
        done = False
        for req, n in plan.items:
            if req.state is not Phase.PREFILLING:
                continue
            req.computed += n
            self.queued_prefill_tokens -= n
            if req.computed < req.total:
                continue  # a prompt chunk
            done = True
            if req.remote and req.prefill_worker == self.worker_id:
                # Prefill side of a disaggregated request: keep the KV for the decode worker's pull.
                req.state = Phase.PREFILLED
                req.prefill_done = now
                req.held_blocks = req.blocks
                req.blocks = 0
                req.computed = 0
                self.held[req.rid] = req
                out.prefilled.append(req)
                continue
            req.generated += 1  # the step that computes the prompt's last token samples the next one
            if req.first_token is None:
                req.first_token = now
                out.first_tokens.append(req)
            if req.generated >= req.output:
                req.state = Phase.DONE
                req.finish = now
                self.free_blocks += req.blocks
                req.blocks = 0
                out.finished.append(req)
                continue
            req.state = Phase.DONE  # leaves prefilling; joins decoding just below
            self._join_decoding(req, gen0=req.generated, tick0=self.tick)
        if done:
            self.prefilling = [r for r in self.prefilling if r.state is Phase.PREFILLING]
        return out

    # -- internals ---------------------------------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _join_decoding(self, req: Req, *, gen0: int, tick0: int) -> None:
        """``req`` has ``gen0`` tokens sampled and all but its last token's KV computed: from step ``tick0`` on,
        each decode step computes one token and samples the next."""
        req.state = Phase.DECODING
        req.gen0 = gen0
        req.generated = gen0
        req.tick0 = tick0
        req.computed = req.prompt + gen0 - 1
        req.seq = self._next_seq()
        self.decoding[req.rid] = req
        heapq.heappush(self._events, (tick0 + req.output - gen0 - 1, 1, req.seq, req))
        self._push_block_event(req)

    def _push_block_event(self, req: Req) -> None:
        # Step T computes position c0 + (T - tick0); it needs a new block when that position reaches blocks * bs.
        c0 = req.prompt + req.gen0 - 1
        at = req.tick0 + req.blocks * self.block_size - c0
        if at <= req.tick0 + req.output - req.gen0 - 1:
            heapq.heappush(self._events, (max(at, req.tick0), 0, req.seq, req))

    def _take_block(self, req: Req) -> bool:
        return self._take_blocks(req, 1, count=False)

    def _take_blocks(self, req: Req, need: int, *, count: bool = True) -> bool:
        """Free ``need`` blocks for ``req`` (preempting the newest running requests while short) and take them;
        False when ``req`` itself was the one preempted. ``count``: add them to ``req.blocks`` here."""
        while need > self.free_blocks:
            victim = self._newest()
            self._preempt(victim)
            self._preempted = True
            if victim is req:
                return False
        self.free_blocks -= need
        if count:
            req.blocks += need
        return True

    def _newest(self) -> Req:
        last_decode = next(reversed(self.decoding.values())) if self.decoding else None
        last_prefill = self.prefilling[-1] if self.prefilling else None
        if last_decode is None:
            assert last_prefill is not None
            return last_prefill
        if last_prefill is None or last_decode.seq > last_prefill.seq:
            return last_decode
        return last_prefill

    def _generated_now(self, req: Req) -> int:
        return req.gen0 + (self.tick - req.tick0)

    def _finish(self, req: Req, now: float) -> None:
        del self.decoding[req.rid]
        req.generated = req.output
        req.computed = req.total - 1
        req.state = Phase.DONE
        req.finish = now
        self.free_blocks += req.blocks
        req.blocks = 0

    def _preempt(self, req: Req) -> None:
        """Recompute mode: the blocks are freed, the request recomputes its prompt and output so far, here."""
        if req.state is Phase.DECODING:
            del self.decoding[req.rid]
            req.generated = self._generated_now(req)
            self.queued_prefill_tokens += req.total
        else:
            self.prefilling.remove(req)
            self.queued_prefill_tokens += req.computed
        self.free_blocks += req.blocks
        req.blocks = 0
        req.computed = 0
        req.preemptions += 1
        req.state = Phase.QUEUED
        req.seq = -1
        self.queued.appendleft(req)
