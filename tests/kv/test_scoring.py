"""Scorers, the Dynamo-style cost, and the selection pipeline: weights, ties, temperature, breakdown."""

from __future__ import annotations

import random

import pytest

from litellm_disagg.routing.pipeline.context import ScoringContext, WorkerLoad, usable_cached_tokens
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import CostWeights, ProfileSettings
from litellm_disagg.routing.pipeline.scorers import (
    KVCostScorer,
    KVFreeScorer,
    LoadScorer,
    PrefixOverlapScorer,
    kv_cost,
)
from tests.kv.helpers import load, worker

A, B, C = worker("a"), worker("b"), worker("c")


def ctx(prompt: int = 1000, cached: dict[str, int] | None = None, *loads: WorkerLoad) -> ScoringContext:
    return ScoringContext(prompt_tokens=prompt, cached_tokens=cached or {}, loads={x.worker_id: x for x in loads})


@pytest.mark.parametrize(
    ("blocks", "block_size", "prompt", "usable"),
    [
        (0, 16, 100, 0),
        (3, 16, 100, 48),
        (7, 16, 100, 96),
        (10, 16, 100, 96),
        (4, 16, 64, 48),
        (1, 16, 17, 16),
        (5, 16, 0, 0),
    ],
)
def test_usable_cached_tokens_never_covers_the_last_token(
    blocks: int, block_size: int, prompt: int, usable: int
) -> None:
    assert usable_cached_tokens(blocks, block_size, prompt) == usable


@pytest.mark.parametrize(
    ("scorer", "context", "expected"),
    [
        (PrefixOverlapScorer(), ctx(1000, {"a": 500, "b": 1000}), {"a": 0.5, "b": 1.0, "c": 0.0}),
        (PrefixOverlapScorer(), ctx(0, {}), {"a": 0.0, "b": 0.0, "c": 0.0}),
        (LoadScorer(), ctx(1, {}, load("a", inflight=3), load("b", inflight=1)), {"a": 0.25, "b": 0.5, "c": 1.0}),
        # scraped running+waiting counts when larger than the router's own count, unless stale
        (
            LoadScorer(),
            ctx(1, {}, load("a", inflight=0, running=3), load("b", inflight=0, running=9, stale=True)),
            {"a": 0.25, "b": 1.0, "c": 1.0},
        ),
        (
            KVFreeScorer(),
            ctx(1, {}, load("a", kv_usage=0.25), load("b", decode_blocks=900, kv_usage=0.5)),
            {"a": 0.75, "b": pytest.approx(0.1), "c": 1.0},
        ),
    ],
)
def test_scorers(scorer, context: ScoringContext, expected: dict[str, float]) -> None:  # type: ignore[no-untyped-def]
    assert scorer.score(context, [A, B, C]) == expected


def test_kv_cost_terms() -> None:
    context = ctx(1000, {"a": 512}, load("a", prefill_tokens=100, decode_blocks=30, inflight=2))
    terms = kv_cost(context, A, CostWeights(prefill=2.0, decode=1.0, active=3.0))
    assert (terms.uncached_blocks, terms.queued_prefill_blocks, terms.used_blocks, terms.active_requests) == (
        31,
        7,
        30,
        2,
    )
    assert terms.total == 2 * (31 + 7) + 30 + 3 * 2


def test_kv_cost_scorer_is_relative() -> None:
    scorer = KVCostScorer(CostWeights(prefill=1.0, decode=0.0, active=0.0))
    scores = scorer.score(ctx(1600, {"a": 1600, "b": 800}), [A, B, C])  # uncached blocks: a 1, b 50, c 100
    assert scores == {"a": 1.0, "b": pytest.approx(1 / 51), "c": pytest.approx(1 / 101)}


def profile(weights: dict[str, float], temperature: float = 0.0, **cost: float) -> ProfileSettings:
    return ProfileSettings.model_validate({"weights": weights, "temperature": temperature, "cost": cost})


@pytest.mark.parametrize(
    ("weights", "context", "allowed", "how"),
    [
        # overlap wins when load is equal
        ({"prefix_overlap": 1.0, "load": 1.0}, ctx(1000, {"b": 900}), {"b"}, "best"),
        # ... and loses when the weights say load matters more (a and c tie, equally idle)
        ({"prefix_overlap": 1.0, "load": 4.0}, ctx(1000, {"b": 900}, load("b", inflight=3)), {"a", "c"}, "tie_random"),
        # equal totals: the least loaded, then random among the least loaded
        (
            {"prefix_overlap": 1.0},
            ctx(1000, {}, load("a", inflight=2), load("b", inflight=0), load("c", inflight=1)),
            {"b"},
            "tie_load",
        ),
        (
            {"prefix_overlap": 1.0},
            ctx(1000, {}, load("a", inflight=2), load("b", inflight=1), load("c", inflight=1)),
            {"b", "c"},
            "tie_random",
        ),
        (
            {"kv_free": 1.0},
            ctx(1000, {}, load("a", inflight=2), load("b", inflight=1), load("c", kv_usage=0.1)),
            {"b"},
            "tie_load",
        ),
        # Dynamo-style cost: the worker holding the prefix wins while its backlog is smaller than the saving...
        ({"kv_cost": 1.0}, ctx(1600, {"a": 1600}, load("a", prefill_tokens=800)), {"a"}, "best"),
        # ... and not when the backlog outweighs it (b and c tie)
        ({"kv_cost": 1.0}, ctx(1600, {"a": 1600}, load("a", prefill_tokens=3200)), {"b", "c"}, "tie_random"),
    ],
)
def test_selection(weights: dict[str, float], context: ScoringContext, allowed: set[str], how: str) -> None:
    selection = Pipeline(profile(weights, decode=0.0, active=0.0), rng=random.Random(1)).select(context, [A, B, C])
    assert (selection.how, selection.worker_id in allowed) == (how, True)


def test_random_ties_spread_over_equal_workers() -> None:
    pipeline = Pipeline(profile({"prefix_overlap": 1.0}), rng=random.Random(7))
    picks = {pipeline.select(ctx(100), [A, B, C]).worker_id for _ in range(60)}
    assert picks == {"a", "b", "c"}


def test_seeded_selection_is_deterministic() -> None:
    def run(seed: int) -> list[str | None]:
        pipeline = Pipeline(profile({"load": 1.0}, temperature=0.5), rng=random.Random(seed))
        return [pipeline.select(ctx(100, {}, load("a", inflight=i % 3)), [A, B, C]).worker_id for i in range(30)]

    assert run(3) == run(3)


def test_temperature_samples_in_proportion() -> None:
    pipeline = Pipeline(profile({"prefix_overlap": 1.0}, temperature=0.25), rng=random.Random(0))
    context = ctx(100, {"a": 100})  # totals a=1, b=c=0: a is e^4 ~ 55 times as likely as each other
    picks = [pipeline.select(context, [A, B, C]).worker_id for _ in range(2000)]
    share = picks.count("a") / len(picks)
    assert 0.93 < share < 0.99
    assert {"b", "c"} <= set(picks)


def test_breakdown_and_ranking() -> None:
    pipeline = Pipeline(profile({"prefix_overlap": 2.0, "kv_cost": 1.0}), rng=random.Random(0))
    selection = pipeline.select(ctx(1000, {"a": 500, "b": 992}, load("a", inflight=1)), [A, B, C])
    assert selection.worker_id == "b"
    b = selection.breakdown["b"]
    assert b.scores["prefix_overlap"] == pytest.approx(0.992)
    assert b.total == pytest.approx(2 * 0.992 + b.scores["kv_cost"])
    assert b.cost is not None and b.cost.uncached_blocks == 1 and b.cached_tokens == 992
    assert selection.ranking() == ["b", "a", "c"]
    assert selection.describe().startswith("picked b (best) b:")


def test_edge_cases() -> None:
    pipeline = Pipeline(profile({"load": 1.0}))
    assert pipeline.select(ctx(), []).worker is None
    only = pipeline.select(ctx(), [A])
    assert only.worker_id == "a" and only.how == "only"


def test_scores_are_clamped() -> None:
    class Wild:
        name = "load"

        def score(self, context: ScoringContext, candidates: list[object]) -> dict[str, float]:
            return {"a": 5.0, "b": -3.0, "c": float("nan")}

    pipeline = Pipeline(profile({"load": 1.0}))
    pipeline.scorers = [(Wild(), 1.0)]  # type: ignore[list-item]
    selection = pipeline.select(ctx(), [A, B, C])
    assert {w: b.total for w, b in selection.breakdown.items()} == {"a": 1.0, "b": 0.0, "c": 0.0}


def test_a_profile_needs_a_positive_weight() -> None:
    with pytest.raises(ValueError):
        profile({"load": 0.0})
    with pytest.raises(ValueError):
        profile({"nonsense": 1.0})


def reference_select(profile: ProfileSettings, ctx: ScoringContext, candidates: list, rng: random.Random):  # type: ignore[no-untyped-def,type-arg]
    """``Pipeline.select`` (first written as ``Selector.select``) and the scorers as first written, with the
    default ``least_loaded`` tie-break: (worker id, how, totals, scores, costs)."""

    def relative(costs: dict[str, float]) -> dict[str, float]:
        lowest = min(costs.values())
        return {wid: (lowest + 1.0) / (cost + 1.0) for wid, cost in costs.items()}

    def score(name: str) -> tuple[dict[str, float], dict | None]:  # type: ignore[type-arg]
        if name == "prefix_overlap":
            if ctx.prompt_tokens <= 0:
                return {w.worker_id: 0.0 for w in candidates}, None
            return {w.worker_id: ctx.cached(w.worker_id) / ctx.prompt_tokens for w in candidates}, None
        if name == "load":
            return relative({w.worker_id: ctx.load(w).active_requests for w in candidates}), None
        if name == "kv_free":
            return {w.worker_id: ctx.load(w).free_kv_fraction for w in candidates}, None
        costs = {w.worker_id: kv_cost(ctx, w, profile.cost) for w in candidates}
        return relative({wid: t.total for wid, t in costs.items()}), costs

    ids = [w.worker_id for w in candidates]
    totals = dict.fromkeys(ids, 0.0)
    scores, costs = {}, None
    for name, weight in profile.weights.items():
        if weight <= 0:
            continue
        values, found = score(name)
        costs = found if found is not None else costs
        clamped = {}
        for wid in ids:
            value = values.get(wid, 0.0)
            value = value if 0.0 <= value <= 1.0 else 1.0 if value > 1.0 else 0.0
            clamped[wid] = value
            totals[wid] += weight * value
        scores[name] = clamped
    if len(candidates) == 1:
        return candidates[0].worker_id, "only", totals, scores, costs
    best = max(totals.values())
    tied = [w for w in candidates if best - totals[w.worker_id] <= 1e-9]
    if len(tied) == 1:
        return tied[0].worker_id, "best", totals, scores, costs
    active = {w.worker_id: ctx.load(w).active_requests for w in tied}
    fewest = min(active.values())
    least = [w for w in tied if active[w.worker_id] == fewest]
    if len(least) == 1:
        return least[0].worker_id, "tie_load", totals, scores, costs
    return rng.choice(least).worker_id, "tie_random", totals, scores, costs


def test_selection_equals_its_first_definition() -> None:
    rng = random.Random(11)
    names = ["prefix_overlap", "load", "kv_free", "kv_cost"]
    pool = [worker(f"w{i}", capacity=rng.choice([0, 100, 1000]), block_size=rng.choice([16, 32])) for i in range(40)]
    for round_ in range(400):
        weights = {n: rng.choice([0.0, 0.25, 1.0, 3.0]) for n in rng.sample(names, rng.randrange(1, 5))}
        if not any(weights.values()):
            weights["load"] = 1.0
        cost = CostWeights(prefill=rng.choice([0.0, 1.0]), decode=rng.choice([0.0, 1.0]), active=rng.random())
        profile = ProfileSettings(weights=weights, cost=cost)  # type: ignore[arg-type]
        candidates = rng.sample(pool, rng.randrange(1, 12))
        listed = candidates + candidates[:1] if round_ % 10 == 0 else candidates  # a worker listed twice: one candidate
        loads = [
            load(
                w.worker_id,
                capacity=w.kv_capacity_blocks,
                inflight=rng.choice([0, 0, 1, 3]),
                prefill_tokens=rng.choice([0, 0, 500]),
                decode_blocks=rng.choice([0, 10]),
                running=rng.choice([0, 2]),
                kv_usage=rng.choice([0.0, 0.5, float("nan")]),
                stale=rng.random() < 0.5,
            )
            for w in candidates[::2]
        ]
        prompt = rng.choice([0, 100, 4096])
        cached = {w.worker_id: rng.choice([0, 48, 4096, 9999]) for w in candidates[1::2]}
        context = ctx(prompt, cached, *loads)
        seed = rng.random()
        got = Pipeline(profile, rng=random.Random(seed)).select(context, listed)
        expected = reference_select(profile, context, candidates, random.Random(seed))
        scores = {name: {wid: b.scores[name] for wid, b in got.breakdown.items()} for name in got.scores}
        costs = None if got.costs is None else dict(got.costs)
        assert (got.worker_id, got.how, got.totals, scores, costs) == expected
        assert list(got.totals) == list(expected[2])


def test_usable_cached_tokens_equals_its_min_definition() -> None:
    for blocks in range(0, 12):
        for block_size in (1, 3, 16):
            for prompt in range(-1, 70):
                expected = 0 if prompt <= 0 else min(blocks, (prompt - 1) // block_size) * block_size
                assert usable_cached_tokens(blocks, block_size, prompt) == expected


def select_by_id(pipeline: Pipeline, ctx: ScoringContext, candidates: list):  # type: ignore[no-untyped-def,type-arg]
    """``Pipeline.select`` as it was before its scores became lists (by worker id, each scorer's ``score``, each
    load's figures computed where they are read): (worker, how, totals, scores, costs, over_bound)."""
    from litellm_disagg.routing.pipeline.bounded_load import within_bound
    from litellm_disagg.routing.pipeline.scorers import KVCostScorer

    ids = [w.worker_id for w in candidates]
    totals = dict.fromkeys(ids, 0.0)
    scores: dict[str, dict[str, float]] = {}
    costs = None
    for scorer, weight in pipeline.scorers:
        if isinstance(scorer, KVCostScorer):
            costs = scorer.costs(ctx, candidates)
            values = scorer.scores_of(costs)
        else:
            values = scorer.score(ctx, candidates)
        clamped = {}
        for wid in ids:
            value = values.get(wid, 0.0)
            clamped[wid] = value if 0.0 <= value <= 1.0 else 1.0 if value > 1.0 else 0.0
            totals[wid] += weight * clamped[wid]
        scores[scorer.name] = clamped
    bounded, over = pipeline.profile.bounded_load, frozenset()
    if bounded is None or len(candidates) == 1:
        worker, how = pipeline.picker.pick(ctx, candidates, totals)
    else:
        active = None if costs is None else [costs[wid].active_requests for wid in ids]
        eligible, over = within_bound(ctx, candidates, bounded, active)
        if not over:
            worker, how = pipeline.picker.pick(ctx, candidates, totals)
        else:
            worker, how = pipeline.picker.pick(ctx, eligible, {w.worker_id: totals[w.worker_id] for w in eligible})
    return worker.worker_id if worker else None, how, totals, scores, costs, over


def test_list_path_equals_the_by_id_path() -> None:
    """``Pipeline.select`` (scores as lists, each load's figures computed once, precomputed or not) against
    ``select_by_id`` (by worker id, the code it replaced): every scorer, bounded load, both tie-breaks, temperature,
    live sessions; the same winner, how, totals (in order), scores, costs and bound, a breakdown consistent with
    them, and the same RNG and rotation state after a run of selections."""
    from litellm_disagg.routing.pipeline.context import figures
    from litellm_disagg.routing.pipeline.profile import BoundedLoadSettings, SessionSettings

    rng = random.Random(5)
    names = ["prefix_overlap", "load", "kv_free", "kv_cost", "live_sessions"]
    pool = [worker(f"w{i}", capacity=rng.choice([0, 100, 1000]), block_size=rng.choice([16, 32])) for i in range(40)]
    for _ in range(150):
        weights = {n: rng.choice([0.0, 0.25, 1.0, 3.0]) for n in rng.sample(names, rng.randrange(1, 6))}
        if not any(weights.values()):
            weights["kv_cost"] = 1.0
        settings = ProfileSettings(
            weights=weights,  # type: ignore[arg-type]
            cost=CostWeights(prefill=rng.choice([0.0, 1.0]), decode=rng.choice([0.0, 1.0]), active=rng.random()),
            temperature=rng.choice([0.0, 0.0, 0.0, 0.3]),
            tie_break=rng.choice(["least_loaded", "rotate"]),
            bounded_load=rng.choice([None, BoundedLoadSettings(), BoundedLoadSettings(factor=1.0, slack=0.0)]),
            sessions=SessionSettings(min_hit_fraction=rng.choice([0.1, 0.5])),
        )
        seed = rng.random()
        fast, slow = Pipeline(settings, rng=random.Random(seed)), Pipeline(settings, rng=random.Random(seed))
        for _ in range(8):
            candidates = rng.sample(pool, rng.randrange(1, 14))
            loads = {
                w.worker_id: load(
                    w.worker_id,
                    capacity=w.kv_capacity_blocks,
                    inflight=rng.choice([0, 0, 1, 3, 9]),
                    prefill_tokens=rng.choice([0, 0, 17, 500]),
                    decode_blocks=rng.choice([0, 10, 2000]),
                    running=rng.choice([0, 2, 7]),
                    waiting=rng.choice([0, 0, 1]),
                    kv_usage=rng.choice([0.0, 0.5, 1.5, float("nan")]),
                    stale=rng.random() < 0.3,
                )
                for w in rng.sample(candidates, rng.randrange(0, len(candidates) + 1))
            }
            prompt = rng.choice([0, 100, 4096])
            cached = {
                w.worker_id: rng.choice([0, 48, 4096, 9999]) for w in rng.sample(candidates, len(candidates) // 2)
            }
            live = {w.worker_id: rng.randrange(0, 4) for w in rng.sample(candidates, len(candidates) // 2)}
            given = rng.choice(["none", "all", "some"])
            precomputed = None
            if given != "none":  # as LoadCache gives them: for workers in loads (some or all of them)
                precomputed = {wid: figures(x) for wid, x in loads.items() if given == "all" or rng.random() < 0.5}
            context = ScoringContext(prompt, cached, loads, live, figures=precomputed)
            got = fast.select(context, candidates)
            worker_id, how, totals, scores, costs, over = select_by_id(slow, context, candidates)
            assert (got.worker_id, got.how, got.over_bound) == (worker_id, how, over)
            assert got.totals == totals and list(got.totals) == list(totals)
            assert got.scores == scores and got.costs == costs
            for wid, b in got.breakdown.items():
                assert b.total == totals[wid] and b.scores == {name: scores[name][wid] for name in scores}
                assert b.cost == (None if costs is None else costs[wid])
                assert b.cached_tokens == context.cached(wid)
            fresh = fast.select(context, candidates)  # details read before the whole breakdown is built
            assert all(fresh.detail(wid) == got.breakdown[wid] for wid in totals)
            select_by_id(slow, context, candidates)  # keep the two in step
        assert fast.picker.rng.getstate() == slow.picker.rng.getstate()
        assert next(fast.picker._turn) == next(slow.picker._turn)
