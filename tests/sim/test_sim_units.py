"""The simulator's pure parts: tokenizer, template, hashing, timing model, paged KV cache, scheduler."""

import pytest

from litellm_disagg.sim import tokenizer
from litellm_disagg.sim.chat_template import render_chat
from litellm_disagg.sim.hashing import block_hashes, hash_block
from litellm_disagg.sim.kv_cache import BlockPool
from litellm_disagg.sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from litellm_disagg.sim.protocol import ChatMessage
from litellm_disagg.sim.request import SimRequest, output_budget
from litellm_disagg.sim.scheduler import Scheduler
from litellm_disagg.sim.settings import EngineSettings, SimSettings, TimingSettings
from litellm_disagg.sim.textgen import Model, completion
from litellm_disagg.sim.timing import StepWork, TimingModel


def test_public_api_is_complete():
    import litellm_disagg.sim as sim

    assert sorted(sim.__all__) == sim.__all__
    assert all(getattr(sim, name) is not None for name in sim.__all__)
    assert {"SimCluster", "SimWorker", "SimEngine", "SimSettings", "TimingModel"} <= set(sim.__all__)


# -- tokenizer, template, text ---------------------------------------------------------------------------------------


def test_tokenizer_is_deterministic_and_word_level():
    ids = tokenizer.encode("Hello, world! Hello again.")
    assert ids == tokenizer.encode("Hello, world! Hello again.")
    assert len(ids) == 7  # Hello , world ! Hello again .
    assert ids[4] == tokenizer.encode(" Hello")[0] and ids[0] != ids[4]  # the space belongs to the word
    assert all(tokenizer.is_valid_token(t) for t in ids)


def test_generated_text_round_trips():
    ids = completion([5, 6, 7], 50)
    assert tokenizer.encode(tokenizer.decode(ids)) == ids


def test_chat_template_is_chatml_and_tokenizes_special_tokens():
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content=[{"type": "text", "text": "Hi"}]),
    ]
    text = render_chat(messages)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text)
    assert ids.count(tokenizer.IM_START) == 3 and ids.count(tokenizer.IM_END) == 2
    assert render_chat(messages, add_generation_prompt=False).endswith("<|im_end|>\n")
    assert render_chat(messages, continue_final_message=True).endswith("user\nHi")


def test_output_depends_on_the_context_only():
    assert completion([1, 2, 3], 5) == completion([1, 2, 3], 5)
    assert completion([1, 2, 3], 5) != completion([1, 2, 4], 5)
    # A continuation from the prompt plus the first k output tokens yields the rest (request migration).
    whole = completion([1, 2, 3], 20)
    assert completion([1, 2, 3, *whole[:7]], 13) == whole[7:]


def test_natural_stop_is_a_function_of_the_context():
    def natural(prompt: list[int], mean: int) -> int:
        model, n = Model(prompt), 0
        while True:
            stop = model.ends_after_next(mean)
            model.append(model.next_token())
            n += 1
            if stop:
                return n

    lengths = [natural([i, i + 1], 8) for i in range(400)]
    assert min(lengths) >= 1 and 6 <= sum(lengths) / len(lengths) <= 10
    prompt = [7, 8, 9]
    n = natural(prompt, 8)
    if n > 1:  # continuing after k tokens stops at the same place
        assert natural([*prompt, *completion(prompt, 1)], 8) == n - 1


def test_output_budget():
    common = {"ignore_eos": False, "max_model_len": 100, "mean_output_tokens": 8}
    assert output_budget(3, max_tokens=10, **common) == (10, "length", None)
    assert output_budget(95, max_tokens=10, **common) == (5, "length", None)
    assert output_budget(3, max_tokens=None, **common) == (97, "length", 8)  # or earlier, by itself
    assert output_budget(3, max_tokens=None, **{**common, "ignore_eos": True}) == (97, "length", None)


# -- hashing and timing ----------------------------------------------------------------------------------------------


def test_block_hashes_are_chained_over_full_blocks():
    tokens = list(range(40))
    hashes = block_hashes(tokens, 16)
    assert len(hashes) == 2  # the trailing 8 tokens form no full block
    assert hashes[0] == hash_block(None, tokens[:16]) and hashes[1] == hash_block(hashes[0], tokens[16:32])
    assert block_hashes([99] + tokens[1:], 16)[1] != hashes[1]  # a change early on changes every later hash
    assert all(0 <= h < 2**64 for h in hashes)


def test_timing_model_matches_the_published_figures():
    model = TimingModel(TimingSettings())
    assert model.decode_tokens_per_s(1) == pytest.approx(50.0)
    assert model.decode_tokens_per_s(64) == pytest.approx(2000.0)
    assert model.decode_tokens_per_s(8) < model.decode_tokens_per_s(32) < model.decode_tokens_per_s(64)
    assert model.step_time(StepWork(prefill_tokens=20_000)) == pytest.approx(1.0)  # compute-bound prefill
    assert model.step_time(StepWork(prefill_tokens=10)) == pytest.approx(model.weight_read_s)  # weight-read floor
    assert model.step_time(StepWork()) == 0.0
    assert model.transfer_time(1000) == pytest.approx(0.002 + 1000 * 327_680 / 25e9)
    fast = TimingModel(TimingSettings(speedup=50))
    assert fast.wall(1.0) == pytest.approx(0.02)


def test_settings_validate_and_read_the_environment(monkeypatch):
    with pytest.raises(ValueError):
        EngineSettings(num_gpu_blocks=4, block_size=16, max_model_len=100)
    with pytest.raises(ValueError):
        TimingSettings(decode_tokens_per_s_batch1=50, decode_tokens_per_s_at_ref_batch=40)
    monkeypatch.setenv("LITELLM_DISAGG_SIM_TIMING__SPEEDUP", "25")
    monkeypatch.setenv("LITELLM_DISAGG_SIM_ENGINE__BLOCK_SIZE", "32")
    settings = SimSettings()
    assert settings.timing.speedup == 25 and settings.engine.block_size == 32
    assert settings.with_speedup(7).timing.speedup == 7


# -- paged KV cache --------------------------------------------------------------------------------------------------


def _cache(pool: BlockPool, tokens: list[int]) -> list[int]:
    """Allocate, compute and cache blocks for ``tokens`` (all full), as a finished request would; returns block ids."""
    hashes = block_hashes(tokens, pool.block_size)
    ids = pool.allocate(len(hashes))
    assert ids is not None
    pool.cache_full_blocks(ids, hashes, None, tokens)
    return ids


def test_prefix_cache_hits_and_lru_eviction():
    events: list = []
    pool = BlockPool(4, 4, on_event=events.append)
    a, b = list(range(8)), list(range(100, 108))
    pool.free(_cache(pool, a))
    pool.free(_cache(pool, b))
    assert pool.usage == 0.0 and pool.num_cached == 4
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [e.token_ids for e in stored] == [tuple(a), tuple(b)]
    assert stored[0].parent_block_hash is None and stored[0].block_size == 4

    # A hit takes the cached blocks back (no longer evictable).
    ha = block_hashes(a + [8, 9, 10, 11], 4)
    assert pool.cached_prefix(ha) == 2
    taken = pool.take_cached(ha[:2])
    assert pool.usage == 0.5

    # Two fresh blocks must evict the least recently freed unreferenced ones: b's.
    fresh = pool.allocate(2)
    assert fresh is not None and pool.cached_prefix(block_hashes(b, 4)) == 0
    assert events[-1] == BlockRemoved(tuple(reversed(block_hashes(b, 4))))  # the tail block was freed first
    assert pool.allocate(1) is None  # everything is referenced now
    pool.free(taken)
    pool.free(fresh)
    assert pool.cached_prefix(ha) == 2  # a stayed cached throughout


def test_duplicate_blocks_are_not_cached_twice_and_reset_clears():
    events: list = []
    pool = BlockPool(8, 4, on_event=events.append)
    first = _cache(pool, list(range(8)))
    second = _cache(pool, list(range(8)))  # the same prefix computed concurrently
    assert pool.num_cached == 2 and len([e for e in events if isinstance(e, BlockStored)]) == 1
    assert not pool.reset_prefix_cache()  # refused while blocks are in use
    pool.free(first)
    pool.free(second)
    assert pool.reset_prefix_cache() and pool.num_cached == 0 and events[-1] == AllBlocksCleared()


# -- scheduler (driven by the timing model's clock, not wall time) ---------------------------------------------------


def _request(rid: str, prompt: list[int], max_tokens: int, **kwargs) -> SimRequest:
    return SimRequest(
        request_id=rid, prompt_token_ids=prompt, max_output_tokens=max_tokens, limit_reason="length", **kwargs
    )


def _run(scheduler: Scheduler, timing: TimingModel, max_steps: int = 100_000) -> float:
    """Step until idle; returns the simulated time."""
    now = 0.0
    for _ in range(max_steps):
        if scheduler.idle:
            return now
        step = scheduler.schedule()
        now += timing.step_time(step.work)
        scheduler.complete(step, now)
    raise AssertionError("scheduler did not finish")


def _engine(**overrides) -> tuple[Scheduler, BlockPool]:
    settings = EngineSettings(**({"num_gpu_blocks": 1024, "block_size": 16, "max_model_len": 2048} | overrides))
    pool = BlockPool(settings.num_gpu_blocks, settings.block_size)
    return Scheduler(settings, pool), pool


def test_continuous_batching_finishes_everything_and_batching_raises_throughput():
    timing = TimingModel(TimingSettings())
    results = {}
    for batch in (1, 64):
        scheduler, pool = _engine(max_num_seqs=batch)
        reqs = [_request(f"r{i}", [1000 + i] * 32, 64) for i in range(64)]
        for r in reqs:
            scheduler.add(r)
        elapsed = _run(scheduler, timing)
        assert all(len(r.output_token_ids) == 64 and r.finish_reason == "length" for r in reqs)
        assert pool.usage == 0.0
        results[batch] = 64 * 64 / elapsed
    assert results[64] > 20 * results[1]
    assert results[1] == pytest.approx(50, rel=0.1)  # prefill steps cost a little on top of pure decode
    assert results[64] == pytest.approx(2000, rel=0.15)


def test_continuous_batching_admits_new_requests_while_others_decode():
    scheduler, _ = _engine()
    first = _request("a", list(range(20)), 50)
    scheduler.add(first)
    for _ in range(5):
        scheduler.complete(scheduler.schedule(), 0.0)
    assert len(first.output_token_ids) == 5
    scheduler.add(_request("b", list(range(50, 70)), 5))
    step = scheduler.schedule()
    assert [(r.request_id, n) for r, n in step.scheduled] == [("a", 1), ("b", 20)]
    assert step.work == StepWork(prefill_tokens=20, decode_seqs=1)


def test_chunked_prefill_and_prefix_cache_hits():
    scheduler, _ = _engine(max_num_batched_tokens=64)
    prompt = list(range(200))
    a = _request("a", prompt, 1)
    scheduler.add(a)
    chunks = []
    while not scheduler.idle:
        step = scheduler.schedule()
        chunks.append(step.work.prefill_tokens)
        scheduler.complete(step, 0.0)
    assert chunks == [64, 64, 64, 8]
    b = _request("b", prompt + [7, 7], 1)
    scheduler.add(b)
    step = scheduler.schedule()
    assert b.num_local_hit_tokens == 192 and step.work.prefill_tokens == 10  # 12 full blocks cached, 10 tokens left
    assert scheduler.stats.prefix_cache_hits == 192
    assert scheduler.stats.prompt_tokens_local_cache_hit == 192
    assert scheduler.stats.prompt_tokens_local_compute == 200 + 10


def test_full_cache_preempts_and_recomputes_with_identical_output():
    # 12 blocks of 4 tokens; each request needs 1 + 5 blocks at its end: three cannot run together.
    scheduler, pool = _engine(num_gpu_blocks=12, block_size=4, max_model_len=48)
    reqs = [_request(f"r{i}", [10 * i + k for k in range(4)], 20) for i in range(3)]
    for r in reqs:
        scheduler.add(r)
    _run(scheduler, TimingModel(TimingSettings()))
    assert scheduler.stats.num_preemptions > 0
    for r in reqs:
        assert r.output_token_ids == completion(r.prompt_token_ids, 20)
    assert pool.usage == 0.0


def test_waiting_requests_queue_while_the_cache_is_full():
    scheduler, _ = _engine(num_gpu_blocks=4, block_size=4, max_model_len=16)
    big = _request("big", list(range(15)), 1)  # 15 tokens of KV: the whole cache
    small = _request("small", [50, 51, 52], 1)
    scheduler.add(big)
    scheduler.add(small)
    step = scheduler.schedule()
    assert [r.request_id for r, _ in step.scheduled] == ["big"] and scheduler.num_waiting == 1
    _run(scheduler, TimingModel(TimingSettings()))
    assert small.finish_reason == "length" and big.finish_reason == "length"


def test_prefill_lease_holds_blocks_until_released_or_expired():
    scheduler, pool = _engine()
    scheduler.add(_request("p", list(range(40)), 1, do_remote_decode=True))
    outputs = []
    while not scheduler.idle:
        outputs += scheduler.complete(scheduler.schedule(), 10.0)
    [out] = outputs
    assert out.finished and out.lease is not None and len(out.lease.block_ids) == 3
    assert pool.usage == pytest.approx(3 / 1024)
    assert scheduler.expire_leases(10.0 + 479) == 0
    assert scheduler.expire_leases(10.0 + 480) == 1 and pool.usage == 0.0
    assert scheduler.lease("p") is None
