"""The event loop: N simulated workers, the product's routing, KV transfers, role flips and a role policy, in
simulated time (nothing sleeps; a minute of traffic at thousands of tokens/s runs in a second or two).

Events, in time order (ties by insertion)::

    arrival      route the request (routing.py); a remote prefill queues on the prefill worker, a local one on the
                 decode worker
    step done    the worker's step ends (engine.py): first tokens, finished requests, computed prompts (their KV is
                 held and the decode worker queues a pull); the worker schedules its next step at once
    pull done    the KV arrived on the decode worker (latency + bytes / bandwidth, one inbound link per worker);
                 the prefill worker's blocks are freed
    tick         every ``policy.interval_s``: signals.py builds ``ClusterSignals`` from the state, the policy
                 answers role moves; each starts a flip
    flip done    ``flip_delay_s`` after the decision the worker serves its new role. Meanwhile it takes no new
                 work, and whatever it had in flight (decodes, queued prefills, KV waiting to be pulled) finishes
                 normally, also after the flip (the real mechanism's contract)
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bench.planner_eval import routing
from bench.planner_eval.engine import Phase, Req, StepPlan, Worker
from bench.planner_eval.workload import Arrival
from litellm_disagg.planner.mixing import EngineProfile
from litellm_disagg.planner.signals import ClusterSignals
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole
from litellm_disagg.sim.settings import EngineSettings, TimingSettings
from litellm_disagg.sim.timing import TimingModel


@dataclass(frozen=True)
class Move:
    worker_id: str
    role: WorkerRole


class RolePolicy(Protocol):
    """Who decides the roles: a fixed split (no moves) or the planner."""

    name: str
    interval_s: float
    """How often ``decide`` is asked (0: never)."""

    def initial_roles(self, n: int) -> list[WorkerRole]: ...

    def decide(self, signals: ClusterSignals, now: float) -> Sequence[Move]: ...


@dataclass(frozen=True)
class ClusterConfig:
    workers: int = 8
    flip_delay_s: float = 1.5
    """Decision to first request served in the new role (issue 9's target: under 2 s)."""
    drain_s: float = 60.0
    """After the last arrival, how long the simulation runs on (requests unfinished by then missed their SLO)."""
    timing: TimingSettings = field(default_factory=TimingSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    signal_window_s: float = 10.0
    """The latency windows the planner sees (requests finished in the last ``signal_window_s``)."""
    seed: int = 0
    first_tick_s: float | None = 0.0
    """When the policy's first step comes: 0 (the default since 2026-12-02), with the first arrival: the planner is
    running when the load arrives and steps at once, as the product's loop does when it starts
    (``PlannerLoop.run``), so its first queue sample is the empty queue; None, one ``interval_s`` in (the protocol
    of the figures before that date: the planner's first sample is then already a backlog, and a trend takes a
    second one)."""
    planner_start: tuple[int, int, int] | None = None
    """The planner arms' layout at t = 0 as (prefill, decode, both) workers; None: the static 1:1 split (the headline
    protocol). ``--planner-start`` of ``python -m bench.planner_eval``."""
    planner_profile: EngineProfile | None = None
    """The engine profile the planner arms get (``planner.engine_profile``: ``profile.py`` measures it on this
    engine); None: none (the planner then never crosses from a split to aggregated on load)."""
    prefill_side_ttft: bool = False
    """The TTFT window the planner sees: False, each request's TTFT (what ``ModelSignals.ttft`` is defined as);
    True, for disaggregated requests only the prefill's part (arrival to prompt computed on the prefill worker), so
    waits on the decode side (pulls queued for decode KV) do not read as prefill pressure. An experiment."""


@dataclass(frozen=True)
class PoolSample:
    t: float
    prefill: int
    decode: int
    both: int
    flipping: int


@dataclass
class RunResult:
    requests: list[Req]
    pools: list[PoolSample]
    moves: list[tuple[float, Move]]
    end_t: float


_ARRIVAL, _STEP, _PULL, _TICK, _FLIP = range(5)


class Cluster:
    def __init__(self, config: ClusterConfig, policy: RolePolicy):
        self.config = config
        self.policy = policy
        self.timing = TimingModel(config.timing)
        roles = policy.initial_roles(config.workers)
        self.workers: dict[str, Worker] = {}
        self.configs: dict[str, RuntimeConfig] = {}
        for i, role in enumerate(roles):
            wid = f"w{i}"
            self.workers[wid] = Worker(wid, role, config.engine, self.timing)
            self.configs[wid] = routing.runtime_config(
                wid, role, i, config.engine.num_gpu_blocks, config.engine.block_size
            )
        self.router = routing.Router(config.seed)
        self.decode_assigned: dict[str, int] = dict.fromkeys(self.workers, 0)
        self.prefill_flights: dict[str, int] = dict.fromkeys(self.workers, 0)
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self._plans: dict[str, StepPlan] = {}
        self.now = 0.0
        self.requests: list[Req] = []
        self.pools: list[PoolSample] = []
        self.moves: list[tuple[float, Move]] = []
        self.pulls_done: list[tuple[float, float]] = []
        """(time, transfer seconds) of every finished pull, for the signals' transfer window."""

    # -- running -----------------------------------------------------------------------------------------------------

    def run(self, arrivals: Sequence[Arrival]) -> RunResult:
        from bench.planner_eval.signals import collect  # signals reads this module's types

        for a in arrivals:
            self._push(a.t, _ARRIVAL, a)
        last = arrivals[-1].t if arrivals else 0.0
        end = last + self.config.drain_s
        if self.policy.interval_s > 0:
            first = self.config.first_tick_s
            self._push(self.policy.interval_s if first is None else first, _TICK, None)
        self._sample_pools()
        pending = len(arrivals)
        while self._events:
            t, _, kind, payload = heapq.heappop(self._events)
            if t > end:
                break
            self.now = t
            if kind == _ARRIVAL:
                pending -= 1
                self._arrive(payload)  # type: ignore[arg-type]
            elif kind == _STEP:
                self._step_done(payload)  # type: ignore[arg-type]
            elif kind == _PULL:
                self._pull_done(payload)  # type: ignore[arg-type]
            elif kind == _TICK:
                if pending == 0 and all(r.finish is not None for r in self.requests):
                    continue  # nothing left to plan for; stop ticking
                for move in self.policy.decide(collect(self, t), t):
                    self._start_flip(move)
                self._push(t + self.policy.interval_s, _TICK, None)
            elif kind == _FLIP:
                self._flip_done(payload)  # type: ignore[arg-type]
        return RunResult(self.requests, self.pools, self.moves, self.now)

    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, payload))

    # -- requests ----------------------------------------------------------------------------------------------------

    def routable(self) -> list[RuntimeConfig]:
        return [self.configs[wid] for wid, w in self.workers.items() if not w.flipping]

    def loads(self) -> dict[str, routing.WorkerLoad]:
        cap = self.config.engine.num_gpu_blocks
        return {
            wid: routing.load(
                wid,
                cap,
                self.decode_assigned[wid] + self.prefill_flights[wid],
                w.queued_prefill_tokens,
                cap - w.free_blocks,
            )
            for wid, w in self.workers.items()
        }

    def _arrive(self, a: Arrival) -> None:
        req = Req(a.rid, a.t, a.prompt_tokens, a.output_tokens, a.phase)
        self.requests.append(req)
        route = self.router.route(a.prompt_tokens, self.routable(), self.loads())
        if route is None:
            return  # nobody can decode (cannot happen with a sane policy): the request never finishes
        req.decode_worker = route.decode
        self.decode_assigned[route.decode] += 1
        if route.prefill is None:
            worker = self.workers[route.decode]
            worker.enqueue_prompt(req)
        else:
            req.remote = True
            req.prefill_worker = route.prefill
            self.prefill_flights[route.prefill] += 1
            worker = self.workers[route.prefill]
            worker.enqueue_prompt(req)
        self._kick(worker)

    def _kick(self, worker: Worker) -> None:
        """A step if the worker is idle and has something to do; the pulls it admits start their transfers."""
        if worker.busy_until is not None or not worker.has_work:
            return  # a busy worker admits queued pulls at its next step, as vLLM's scheduler does
        plan = worker.schedule()
        for req, done in worker.start_transfers(plan.pulls, self.now):
            self._push(done, _PULL, req)
        if not (plan.items or plan.decode_seqs):
            return  # nothing to compute (blocked on KV blocks, or only pulls started): a finish, a released lease
            # or a pull's arrival kicks it again
        worker.busy_until = self.now + plan.duration
        worker.busy_s += plan.duration
        self._plans[worker.worker_id] = plan
        self._push(worker.busy_until, _STEP, worker)

    def _step_done(self, worker: Worker) -> None:
        plan = self._plans.pop(worker.worker_id)
        worker.busy_until = None
        result = worker.complete(plan, self.now)
        for req in result.prefilled:
            self.prefill_flights[worker.worker_id] -= 1
            decode = self.workers[req.decode_worker]
            decode.enqueue_pull(req)
            if decode is not worker:
                self._kick(decode)
        for req in result.finished:
            self.decode_assigned[req.decode_worker] -= 1
        self._kick(worker)

    def _pull_done(self, req: Req) -> None:
        decode = self.workers[req.decode_worker]
        decode.pull_done(req)
        self.pulls_done.append((self.now, req.transfer_s))
        assert req.prefill_worker is not None
        prefill = self.workers[req.prefill_worker]
        prefill.release_held(req)
        self._kick(prefill)
        self._kick(decode)

    # -- roles -------------------------------------------------------------------------------------------------------

    def _start_flip(self, move: Move) -> None:
        worker = self.workers.get(move.worker_id)
        if worker is None or worker.flipping or worker.role is move.role:
            return
        worker.pending_role = move.role
        worker.flip_at = self.now + self.config.flip_delay_s
        self.moves.append((self.now, move))
        self._push(worker.flip_at, _FLIP, worker)
        self._sample_pools()

    def _flip_done(self, worker: Worker) -> None:
        assert worker.pending_role is not None
        worker.role = worker.pending_role
        worker.pending_role = None
        worker.flip_at = None
        self.configs[worker.worker_id] = self.configs[worker.worker_id].model_copy(update={"role": worker.role})
        self._sample_pools()
        self._kick(worker)

    def _sample_pools(self) -> None:
        roles = [w.role for w in self.workers.values() if not w.flipping]
        self.pools.append(
            PoolSample(
                self.now,
                roles.count(WorkerRole.PREFILL),
                roles.count(WorkerRole.DECODE),
                roles.count(WorkerRole.BOTH),
                sum(w.flipping for w in self.workers.values()),
            )
        )


def unfinished(result: RunResult) -> int:
    return sum(1 for r in result.requests if r.state is not Phase.DONE)
