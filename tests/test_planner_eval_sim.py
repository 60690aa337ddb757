"""Is the planner evaluation's simulator good enough? The effects the disaggregation argument rests on
(docs/planner-evaluation.md, "Is the simulator good enough"), on the harness's own engine. Pure, well under a second."""

from __future__ import annotations

import pytest

from bench.planner_eval import checks
from bench.planner_eval.cluster import Cluster, ClusterConfig
from bench.planner_eval.policies import Static
from bench.planner_eval.workload import Arrival, Segment, schedule
from litellm_disagg.sim.settings import TimingSettings
from litellm_disagg.sim.timing import StepWork, TimingModel


def test_a_long_prefill_in_a_mixed_batch_stretches_every_decode():
    r = checks.mixed_batch_stall(prompt_tokens=8000, batch=32)
    # 8,000 tokens in 2,048-token chunks: four steps carry a chunk, each ~4x a decode step for all 32 decoders.
    assert r.stalled_steps == 4
    assert r.max_gap_aggregated_s > 3.5 * r.decode_step_s
    # The same prompt prefilled elsewhere: the decoders only pay for one more sequence in the batch.
    assert r.max_gap_disaggregated_s < 1.05 * r.decode_step_s


@pytest.mark.parametrize("prompt_tokens", [1000, 8000])
def test_the_transfer_costs_latency_plus_bytes_over_bandwidth(prompt_tokens):
    r = checks.transfer_cost(prompt_tokens)
    timing = TimingModel(TimingSettings())
    assert r.transfer_s == pytest.approx(timing.transfer_time(prompt_tokens))
    one_step = timing.step_time(StepWork(decode_seqs=1))
    # Disaggregated TTFT = prefill + transfer + the decode worker's step that recomputes the last token.
    assert r.ttft_disaggregated_s == pytest.approx(r.prefill_s + r.transfer_s + one_step)
    assert r.ttft_aggregated_s == pytest.approx(r.prefill_s)


def test_the_transfer_grows_with_the_prompt():
    assert checks.transfer_cost(8000).transfer_s > 5 * checks.transfer_cost(1000).transfer_s


def test_decode_kv_capacity_is_a_hard_limit():
    r = checks.kv_capacity_limit(kv_blocks=1024, requests=40, prompt_tokens=2000)
    assert r.max_running <= r.kv_blocks // (2000 // 16)  # never more decoding than the blocks hold
    assert r.max_queued_pulls > 0  # the rest waited for blocks
    assert r.finished == r.requests  # and were served once blocks came free


def test_a_bigger_cache_runs_more_at_once():
    small = checks.kv_capacity_limit(kv_blocks=1024)
    big = checks.kv_capacity_limit(kv_blocks=4096)
    assert big.max_running > small.max_running


def test_preempted_requests_are_recomputed_and_finish():
    # Decodes that outgrow a tiny cache preempt the newest (recompute mode) and still finish with every token.
    from litellm_disagg.sim.settings import EngineSettings

    engine = EngineSettings(num_gpu_blocks=200, max_model_len=2048)
    arrivals = [Arrival(i, 0.0, 300, 400, "generation-heavy") for i in range(12)]
    result = Cluster(ClusterConfig(workers=1, engine=engine), Static(0, 0, 1)).run(arrivals)
    assert all(r.finish is not None and r.generated == r.output for r in result.requests)
    assert sum(r.preemptions for r in result.requests) > 0


def test_every_request_finishes_once_with_its_tokens_on_every_layout():
    arrivals = schedule([Segment("bursts", 6.0, 20.0)], seed=3)
    for split in (Static(0, 0, 4), Static(1, 3), Static(3, 1), Static(1, 1, 2)):
        result = Cluster(ClusterConfig(workers=4), split).run(arrivals)
        assert len(result.requests) == len(arrivals)
        for r in result.requests:
            assert r.finish is not None and r.first_token is not None and r.generated == r.output
            assert r.arrival <= r.first_token <= r.finish
        workers = Cluster(ClusterConfig(workers=4), split).workers.values()
        assert all(w.free_blocks == w.capacity for w in workers)


def test_a_pull_never_takes_the_blocks_a_running_decode_needs_next():
    """vLLM's order (``vllm/v1/core/sched/scheduler.py``): running requests take their blocks first; a request whose
    KV is remote gets its blocks from the waiting queue afterwards, in a step that preempted nothing. A pull that
    arrives while every decoder is one token short of a new block, with just enough free blocks for the pull or the
    decoders but not both, waits; nobody is preempted."""
    from bench.planner_eval.engine import Phase, Req
    from litellm_disagg.runtime_config import WorkerRole
    from litellm_disagg.sim.settings import EngineSettings

    k, m, pull_blocks = 4, 8, 10
    engine = EngineSettings(num_gpu_blocks=k * m + k + pull_blocks - 1, max_model_len=512)
    cluster = Cluster(ClusterConfig(workers=2, engine=engine), Static(1, 1))
    decode = cluster.workers["w1"]
    assert decode.role is WorkerRole.DECODE
    decoders = [Req(i, 0.0, 16 * m, 100, "check") for i in range(k)]  # m full blocks: the next token needs one more
    for req in decoders:
        decode.enqueue_prompt(req)
    while any(r.first_token is None for r in decoders):
        decode.complete(decode.schedule(), 0.0)
    assert decode.free_blocks == k + pull_blocks - 1  # each decoder needs one block at its next token
    pull = Req(k, 0.0, 16 * pull_blocks, 10, "check")
    pull.remote, pull.prefill_worker = True, "w0"
    decode.enqueue_pull(pull)
    cluster._kick(decode)  # as when a prefill finishes: the decode worker's next step
    assert sum(r.preemptions for r in decoders) == 0
    assert pull.state is Phase.PULL_QUEUED  # it waits for blocks a finish frees
    assert all(r.state is Phase.DECODING for r in decoders)


def test_a_step_that_preempts_admits_no_pull():
    from bench.planner_eval.engine import Phase, Req
    from litellm_disagg.sim.settings import EngineSettings

    k, m = 4, 8
    engine = EngineSettings(num_gpu_blocks=k * m + k - 1, max_model_len=512)  # one block short for the decoders
    cluster = Cluster(ClusterConfig(workers=2, engine=engine), Static(1, 1))
    decode = cluster.workers["w1"]
    decoders = [Req(i, 0.0, 16 * m, 100, "check") for i in range(k)]
    for req in decoders:
        decode.enqueue_prompt(req)
    while any(r.first_token is None for r in decoders):
        decode.complete(decode.schedule(), 0.0)
    pull = Req(k, 0.0, 16, 10, "check")  # one block: it would fit once the newest decoder is preempted
    pull.remote, pull.prefill_worker = True, "w0"
    decode.enqueue_pull(pull)
    plan = decode.schedule()
    assert sum(r.preemptions for r in decoders) == 1
    assert plan.pulls == [] and pull.state is Phase.PULL_QUEUED
