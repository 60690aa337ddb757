"""Is the simulator good enough? The three effects the disaggregation argument rests on, each measured on the
harness's own engine (``engine.py``, ``cluster.py``) with the default timing model. Pure; each returns its figures.

(a) ``mixed_batch_stall``: a long prompt joining an aggregated worker's decode batch stretches every co-running
    request's inter-token gaps while its chunks run; on a decode worker (the prompt prefilled elsewhere) the gaps
    stay at the decode step.
(b) ``transfer_cost``: a disaggregated request's TTFT is the prefill, plus the KV transfer (latency + bytes over the
    link), plus one decode step; the transfer grows with the prompt.
(c) ``kv_capacity_limit``: a decode worker admits a pull only when the prompt's blocks are free; with a small KV
    cache, requests wait (queued pulls) and the running batch never exceeds what the blocks hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.planner_eval.cluster import Cluster, ClusterConfig
from bench.planner_eval.engine import Req, Worker
from bench.planner_eval.policies import Static
from bench.planner_eval.workload import Arrival
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim.settings import EngineSettings, TimingSettings
from litellm_disagg.sim.timing import StepWork, TimingModel


@dataclass(frozen=True)
class StallResult:
    decode_step_s: float
    """Step time of the decode batch alone."""
    max_gap_aggregated_s: float
    """Longest gap between two tokens of a co-running request on the aggregated worker while the prompt ran."""
    max_gap_disaggregated_s: float
    """The same on a decode worker that received the prompt's KV instead."""
    stalled_steps: int
    """Steps on the aggregated worker that carried a prompt chunk (each one stretched every decode)."""


def _gaps(worker: Worker, batch: list[Req], until_done: Req, timing: TimingModel) -> tuple[list[float], int]:
    """Steps ``worker`` until ``until_done`` has its first token; the step durations its decoders saw, and how many
    steps carried prefill."""
    now = 0.0
    gaps: list[float] = []
    stalled = 0
    while until_done.first_token is None:
        plan = worker.schedule()
        now += plan.duration
        worker.complete(plan, now)
        gaps.append(plan.duration)
        stalled += plan.prefill_tokens > 1
    return gaps, stalled


def mixed_batch_stall(prompt_tokens: int = 8000, batch: int = 32) -> StallResult:
    engine = EngineSettings()
    timing = TimingModel(TimingSettings())
    results = []
    for role in (WorkerRole.BOTH, WorkerRole.DECODE):
        worker = Worker("w", role, engine, timing)
        decoders = [Req(i, 0.0, 256, 10_000, "check") for i in range(batch)]
        for r in decoders:
            worker.enqueue_prompt(r)
        while any(r.first_token is None for r in decoders):  # bring the batch to steady decoding
            plan = worker.schedule()
            worker.complete(plan, 0.0)
        long = Req(batch, 0.0, prompt_tokens, 4, "check")
        if role is WorkerRole.BOTH:
            worker.enqueue_prompt(long)
        else:  # its KV arrives from a prefill worker
            long.remote = True
            long.prefill_worker = "elsewhere"
            worker.enqueue_pull(long)
            for req in worker.admit_pulls():
                worker.pull_done(req)
        results.append(_gaps(worker, decoders, long, timing))
    (agg_gaps, stalled), (dis_gaps, _) = results
    return StallResult(
        decode_step_s=timing.step_time(StepWork(decode_seqs=batch)),
        max_gap_aggregated_s=max(agg_gaps),
        max_gap_disaggregated_s=max(dis_gaps),
        stalled_steps=stalled,
    )


@dataclass(frozen=True)
class TransferResult:
    prompt_tokens: int
    transfer_s: float
    ttft_disaggregated_s: float
    ttft_aggregated_s: float
    prefill_s: float


def transfer_cost(prompt_tokens: int) -> TransferResult:
    """One request alone on an idle cluster: 1 prefill + 1 decode worker, and 1 aggregated worker."""
    config = ClusterConfig(workers=2)
    arrival = [Arrival(0, 0.0, prompt_tokens, 2, "prompt-heavy")]
    dis = Cluster(config, Static(1, 1)).run(arrival).requests[0]
    agg = Cluster(ClusterConfig(workers=1), Static(0, 0, 1)).run(arrival).requests[0]
    timing = TimingModel(config.timing)
    chunk = config.engine.max_num_batched_tokens
    prefill_s = sum(
        timing.step_time(StepWork(prefill_tokens=min(chunk, prompt_tokens - i))) for i in range(0, prompt_tokens, chunk)
    )
    assert dis.ttft is not None and agg.ttft is not None
    return TransferResult(prompt_tokens, dis.transfer_s, dis.ttft, agg.ttft, prefill_s)


@dataclass(frozen=True)
class CapacityResult:
    kv_blocks: int
    requests: int
    blocks_per_request: int
    max_running: int
    """Most requests decoding at once on the decode worker."""
    max_queued_pulls: int
    """Most requests waiting for blocks to pull into."""
    finished: int


def kv_capacity_limit(kv_blocks: int = 1024, requests: int = 40, prompt_tokens: int = 2000) -> CapacityResult:
    """``requests`` prompts arrive at once at 1 prefill + 1 decode worker whose caches hold ``kv_blocks`` blocks."""
    engine = EngineSettings(num_gpu_blocks=kv_blocks, max_model_len=min(8192, kv_blocks * 16))
    config = ClusterConfig(workers=2, engine=engine)
    arrivals = [Arrival(i, 0.0, prompt_tokens, 200, "prompt-heavy") for i in range(requests)]
    cluster = Cluster(config, Static(1, 1))
    decode = cluster.workers["w1"]
    peak_running = peak_queued = 0
    original = decode.schedule

    def observed_schedule():  # type: ignore[no-untyped-def]
        nonlocal peak_running, peak_queued
        plan = original()
        peak_running = max(peak_running, decode.running)
        peak_queued = max(peak_queued, len(decode.pull_queue))
        return plan

    decode.schedule = observed_schedule  # type: ignore[method-assign]
    result = cluster.run(arrivals)
    return CapacityResult(
        kv_blocks=kv_blocks,
        requests=requests,
        blocks_per_request=-(-(prompt_tokens + 200) // engine.block_size),
        max_running=peak_running,
        max_queued_pulls=peak_queued,
        finished=sum(r.finish is not None for r in result.requests),
    )
