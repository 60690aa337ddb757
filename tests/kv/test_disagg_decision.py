"""Conditional disaggregation: the cost model's choices, overrides, and the online estimates."""

from __future__ import annotations

import pytest

from litellm_disagg.routing.kv.disagg_decision import DisaggDecider, DisaggInputs, LinearEstimate, OnlineLinearFit
from litellm_disagg.routing.kv.settings import DisaggDecisionSettings


def decider(**settings: object) -> DisaggDecider:
    return DisaggDecider(DisaggDecisionSettings.model_validate(settings))


@pytest.mark.parametrize(
    ("inputs", "remote"),
    [
        # long uncached prompt, idle prefill pool: remote
        (DisaggInputs(prompt_tokens=8000), True),
        (DisaggInputs(prompt_tokens=8000, decode_running=8), True),
        # saturated prefill pool (a minute of backlog): local
        (DisaggInputs(prompt_tokens=8000, prefill_queued_tokens=600_000), False),
        # prompt already cached on the decode worker: local
        (DisaggInputs(prompt_tokens=8000, decode_cached_tokens=7984), False),
        # short prompt: the remote hop's overhead is not worth it
        (DisaggInputs(prompt_tokens=100), False),
        # cached on the prefill worker, not on the decode worker: remote is cheap
        (DisaggInputs(prompt_tokens=8000, prefill_cached_tokens=7984, prefill_queued_tokens=5_000), True),
        # busy decode worker: even a mid-size prompt goes remote
        (DisaggInputs(prompt_tokens=300, decode_running=30), True),
        # no prefill worker at all
        (DisaggInputs(prompt_tokens=8000, prefill_available=False), False),
    ],
)
def test_auto_decisions(inputs: DisaggInputs, remote: bool) -> None:
    decision = decider().decide(inputs)
    assert decision.remote is remote, decision.reason
    if inputs.prefill_available:
        assert decision.remote_cost_s is not None and decision.local_cost_s is not None


def test_crossover_follows_measurements_not_a_fixed_threshold() -> None:
    def crossover(d: DisaggDecider) -> int:
        return next(n for n in range(16, 100_000, 16) if d.decide(DisaggInputs(prompt_tokens=n)).remote)

    default = crossover(decider())
    assert 200 <= default <= 320  # about 260 with the priors
    slow_hop = decider()
    for _ in range(200):  # measured: every transfer costs 200 ms whatever its size
        slow_hop.observe_transfer(tokens=1000, seconds=0.2)
        slow_hop.observe_transfer(tokens=4000, seconds=0.2)
    assert crossover(slow_hop) > 5 * default


@pytest.mark.parametrize(
    ("settings", "inputs", "remote", "reason"),
    [
        ({"mode": "never"}, DisaggInputs(prompt_tokens=100_000), False, "mode never"),
        ({"mode": "always"}, DisaggInputs(prompt_tokens=10, prefill_queued_tokens=10**9), True, "mode always"),
        ({"mode": "always"}, DisaggInputs(prompt_tokens=10, prefill_available=False), False, "no prefill worker"),
        (
            {"min_remote_prefill_tokens": 512},
            DisaggInputs(prompt_tokens=600, decode_cached_tokens=96),
            False,
            "override: 504 uncached tokens < 512",
        ),
        (
            {"min_remote_prefill_tokens": 512},
            DisaggInputs(prompt_tokens=600, prefill_queued_tokens=10**9),
            True,
            "override: 600 uncached tokens >= 512",
        ),
        ({"min_remote_prefill_tokens": 0}, DisaggInputs(prompt_tokens=1), True, "override: 1 uncached tokens >= 0"),
    ],
)
def test_overrides(settings: dict[str, object], inputs: DisaggInputs, remote: bool, reason: str) -> None:
    decision = decider(**settings).decide(inputs)
    assert (decision.remote, decision.reason) == (remote, reason)


def test_decisions_are_deterministic_given_observations() -> None:
    def run() -> list[bool]:
        d = decider()
        out = []
        for i in range(50):
            d.observe_prefill(computed_tokens=500 + 37 * i, seconds=0.01 + i * 0.003, queued_tokens=i * 10)
            d.observe_transfer(tokens=100 * i, seconds=0.002 * i)
            out.append(d.decide(DisaggInputs(prompt_tokens=40 * i, prefill_queued_tokens=2000)).remote)
        return out

    assert run() == run()


def test_online_fit_converges_to_measurements() -> None:
    fit = OnlineLinearFit(LinearEstimate(overhead_s=0.5, tokens_per_s=100.0), halflife_observations=20)
    truth = LinearEstimate(overhead_s=0.03, tokens_per_s=5000.0)
    for i in range(400):
        tokens = 200 + (i * 613) % 8000
        fit.observe(tokens, truth.seconds(tokens))
    estimate = fit.estimate()
    assert estimate.tokens_per_s == pytest.approx(5000, rel=0.05)
    assert estimate.overhead_s == pytest.approx(0.03, abs=0.01)


def test_online_fit_prior_and_degenerate_observations() -> None:
    prior = LinearEstimate(overhead_s=0.02, tokens_per_s=10_000.0)
    fit = OnlineLinearFit(prior, halflife_observations=50)
    assert fit.estimate() == prior
    for _ in range(100):  # always the same size: prior overhead, rate through the observations
        fit.observe(1000, 0.5)
    assert fit.estimate() == LinearEstimate(overhead_s=0.02, tokens_per_s=pytest.approx(1000 / 0.48))
    fast = OnlineLinearFit(prior, halflife_observations=50)
    fast.observe(1000, 0.01)  # faster than the prior overhead alone
    assert fast.estimate().overhead_s == 0.01 and fast.estimate().seconds(1000) == pytest.approx(0.01, abs=1e-6)
    fit.observe(-1, 1.0)
    fit.observe(10, float("nan"))
    assert fit.observations == 100


def test_queued_tokens_are_part_of_a_prefill_observation() -> None:
    d = decider(prior_prefill_overhead_s=0.0)
    for i in range(300):
        computed = 1000 + (i % 7) * 500
        queued = (i % 5) * 4000
        d.observe_prefill(computed, (computed + queued) / 20_000, queued_tokens=queued)
    assert d.prefill.estimate().tokens_per_s == pytest.approx(20_000, rel=0.05)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_slow_first_observation_stops_ruling_once_it_is_stale() -> None:
    """One slow remote prefill and one slow transfer (a cold engine, a first NIXL handshake) make every prompt local,
    and local prompts bring no new observation; after ``estimate_ttl_s`` the lines are the priors again and the next
    long prompt goes remote, to be measured again."""
    clock = _Clock()
    d = DisaggDecider(DisaggDecisionSettings(estimate_ttl_s=60), clock=clock)
    long_prompt = DisaggInputs(prompt_tokens=1500)
    assert d.decide(long_prompt).remote
    d.observe_prefill(1500, 0.5)
    d.observe_transfer(1500, 3.0)
    assert not d.decide(long_prompt).remote  # the transfer looks slower than computing the prompt on the decode worker
    clock.now += 59
    assert not d.decide(long_prompt).remote and d.estimates().transfer_observations == 1
    clock.now += 2
    assert d.decide(long_prompt).remote
    estimates = d.estimates()
    assert (estimates.prefill_observations, estimates.transfer_observations) == (0, 0)
    assert estimates.prefill == d.prefill.prior and estimates.transfer == d.transfer.prior


def test_fresh_observations_keep_an_estimate_and_no_ttl_keeps_it_for_good() -> None:
    clock = _Clock()
    d = DisaggDecider(DisaggDecisionSettings(estimate_ttl_s=60), clock=clock)
    for _ in range(5):
        d.observe_prefill(1000, 0.2)
        clock.now += 30
    assert d.estimates().prefill_observations == 5
    forever = DisaggDecider(DisaggDecisionSettings(estimate_ttl_s=None), clock=clock)
    forever.observe_transfer(1500, 3.0)
    clock.now += 10_000
    assert forever.estimates().transfer_observations == 1


# -- shared compute (engines on one machine's cores or GPU, as ``litellm-disagg up`` runs them) --------------------------

# The situation measured on 1P+2D vLLM CPU workers: the decode worker holds the document and lacks ~150 tokens (question
# and partial last block), one request running there. Separate hardware: remote; shared compute: local.
_HELD_ON_DECODE = DisaggInputs(prompt_tokens=790, decode_cached_tokens=640, prefill_cached_tokens=640, decode_running=1)


@pytest.mark.parametrize(
    ("inputs", "separate", "shared"),
    [
        (_HELD_ON_DECODE, True, False),
        # a long cold prompt: separate hardware sends it away; sharing the cores, remote saves nothing and pays the hop
        (DisaggInputs(prompt_tokens=8000), True, False),
        (DisaggInputs(prompt_tokens=8000, decode_running=8), True, False),
        # the prefill worker holds the prompt, the decode worker does not: remote computes less, so it still wins
        (DisaggInputs(prompt_tokens=8000, prefill_cached_tokens=7984), True, True),
        # the decode worker's own backlog of local prefills is long: remote
        (DisaggInputs(prompt_tokens=2000, decode_queued_tokens=100_000), True, True),
    ],
)
def test_shared_compute_charges_the_stall_to_both_options(inputs: DisaggInputs, separate: bool, shared: bool) -> None:
    assert decider().decide(inputs).remote is separate
    decision = decider(shared_compute=True).decide(inputs)
    assert decision.remote is shared, decision.reason
    assert decision.reason.endswith(", shared compute 1")


def test_shared_compute_prices_remote_with_the_same_stall_as_local() -> None:
    """Same tokens to compute on either side: remote costs exactly local plus the hop (overhead and transfer)."""
    d = decider(
        shared_compute=True,
        prior_prefill_tokens_per_s=400.0,
        prior_prefill_overhead_s=0.02,
        prior_transfer_tokens_per_s=200_000.0,
        prior_transfer_overhead_s=0.005,
    )
    remote, local = d.costs(_HELD_ON_DECODE)
    assert local == pytest.approx(150 / 400 * (1 + 1.0 * 2))
    assert remote == pytest.approx(local + 0.02 + 0.005 + 150 / 200_000)
    separate_remote, separate_local = decider(
        prior_prefill_tokens_per_s=400.0,
        prior_prefill_overhead_s=0.02,
        prior_transfer_tokens_per_s=200_000.0,
        prior_transfer_overhead_s=0.005,
    ).costs(_HELD_ON_DECODE)
    assert separate_local == pytest.approx(local)
    assert separate_remote == pytest.approx(0.02 + 150 / 400 + 0.005 + 150 / 200_000)


def test_shared_compute_is_a_share_of_the_stall_charged_to_remote():
    """3 one-thread engines on 2 cores lose a third of a remote prefill's compute: at the priors, the document the
    decode worker holds stays local while a cold one goes remote (the oracle's choices on that machine)."""
    share = 1 - 2 / 3
    d = decider(shared_compute=share)
    assert d.decide(_HELD_ON_DECODE).remote is False
    cold = DisaggInputs(prompt_tokens=790, decode_running=1)
    decision = d.decide(cold)
    assert decision.remote is True and decision.reason.endswith(f", shared compute {share:g}")
    remote, local = d.costs(cold)
    full_remote, _ = decider(shared_compute=1.0).costs(cold)
    separate_remote, _ = decider().costs(cold)
    assert remote == pytest.approx(separate_remote + share * (full_remote - separate_remote))
    assert decider(shared_compute=True).settings.shared_compute == 1.0
    with pytest.raises(ValueError):
        decider(shared_compute=1.5)


# -- both paths observed: each request's first token on its decode worker (``first_token.py``) ------------------------

# Measured on 1P+2D vLLM CPU workers: a decode worker holding the document still lacks ~150 tokens; local requests got
# their first token in 1.5-1.8 s while the unobserved local option was priced from the prefill line alone.
_WARM = DisaggInputs(prompt_tokens=790, decode_cached_tokens=640, prefill_cached_tokens=640, decode_running=1)


def test_without_first_token_observations_the_local_price_is_the_prior_formula() -> None:
    d = decider()
    remote, local = d.costs(_WARM)
    compute = 150 / 10_000.0  # the prior prefill rate, no overhead
    assert local == pytest.approx(compute + 1.0 * (1 + 1) * compute)
    assert remote == pytest.approx(0.02 + 150 / 10_000.0 + 0.005 + 150 / 200_000.0)
    estimates = d.estimates()
    assert estimates.local == LinearEstimate(0.0, 10_000.0) and estimates.local_observations == 0
    assert estimates.remote_tail == d.transfer.prior and estimates.remote_tail_observations == 0


def test_slow_local_first_tokens_raise_the_local_price_and_switch_the_choice() -> None:
    """Fed none, the local option keeps the prior; fed slow local prefills, its price follows them and the choice
    goes remote. Remote observations alone (the only ones before) leave the local price a guess."""
    unfed, fed = decider(shared_compute=True), decider(shared_compute=True)  # engines on one machine: local first
    assert not unfed.decide(_WARM).remote and not fed.decide(_WARM).remote
    for _ in range(10):
        fed.observe_first_token(local=True, tokens=150, seconds=1.6)
    remote, local = fed.costs(_WARM)
    assert local >= 1.6  # its own measured wait, plus the stall charge
    decision = fed.decide(_WARM)
    assert decision.remote and decision.remote_cost_s == pytest.approx(remote)
    # One size observed: the rate stays the prefill line's, the rest is a fixed wait, so a longer prompt costs more.
    line = fed.estimates().local
    assert line is not None and line.tokens_per_s == 10_000.0 and line.overhead_s == pytest.approx(1.6 - 0.015)
    assert not unfed.decide(_WARM).remote  # unchanged: no observation, the prior


def test_slow_remote_first_tokens_raise_the_remote_price() -> None:
    d = decider()
    cold = DisaggInputs(prompt_tokens=4000)
    assert d.decide(cold).remote
    for tokens in (3000, 4000, 5000, 4000):
        d.observe_first_token(local=False, tokens=tokens, seconds=2.0 + tokens / 200_000.0)
    remote, local = d.costs(cold)
    assert remote > 2.0 and not d.decide(cold).remote
    d.observe_first_token(local=True, tokens=4000, seconds=8.0)  # and a slow local path sends it back
    assert d.decide(cold).remote


def test_first_token_lines_expire_like_the_others() -> None:
    clock = _Clock()
    d = DisaggDecider(DisaggDecisionSettings(estimate_ttl_s=60, shared_compute=1.0), clock=clock)
    d.observe_first_token(local=True, tokens=150, seconds=1.6, queued_tokens=50)
    d.observe_first_token(local=False, tokens=150, seconds=0.4)
    assert (d.estimates().local_observations, d.estimates().remote_tail_observations) == (1, 1)
    assert d.decide(_WARM).remote
    clock.now += 61
    assert (d.estimates().local_observations, d.estimates().remote_tail_observations) == (0, 0)
    assert not d.decide(_WARM).remote


def test_one_size_fit_can_keep_the_prior_rate() -> None:
    prior = LinearEstimate(overhead_s=0.0, tokens_per_s=1000.0)
    fit = OnlineLinearFit(prior, halflife_observations=50, one_size="overhead")
    for _ in range(5):
        fit.observe(100, 0.5)
    assert fit.estimate() == LinearEstimate(overhead_s=pytest.approx(0.4), tokens_per_s=1000.0)
    assert fit.estimate(LinearEstimate(0.0, 500.0)) == LinearEstimate(pytest.approx(0.3), 500.0)
    fast = OnlineLinearFit(prior, halflife_observations=50, one_size="overhead")
    fast.observe(100, 0.05)  # faster than the prior rate: no overhead, the rate through the observations
    assert fast.estimate() == LinearEstimate(overhead_s=0.0, tokens_per_s=pytest.approx(2000.0))


def test_sizes_too_close_for_their_timing_noise_count_as_one_size() -> None:
    """A proxy replica's first local first tokens (seen on 2026-12-06, 4 replicas over 4P+4D simulated workers): 4
    and 8 tokens, 52-72 ms. Least squares put 2.7 ms on each token (about 400 tokens/s, on workers that prefill
    20,000): a cold 2,077-token prompt priced locally at 5.6 s, so the replica never prefilled locally again in its
    run. The slope's standard error (1.8 ms per token) is 36 times the prior's 0.05: they count as one size."""
    prior = LinearEstimate(overhead_s=0.0, tokens_per_s=20_000.0)
    fit = OnlineLinearFit(prior, halflife_observations=50, one_size="overhead")
    for tokens, seconds in ((4, 0.0665), (4, 0.0518), (8, 0.0682), (8, 0.0722)):
        fit.observe(tokens, seconds)
    line = fit.estimate()
    assert line.tokens_per_s == 20_000.0 and line.overhead_s == pytest.approx(0.0644, abs=1e-3)
    assert line.seconds(2077) < 0.2

    d = DisaggDecider(DisaggDecisionSettings())
    for tokens, queued, seconds in ((4, 0, 0.0665), (4, 0, 0.0518), (4, 4, 0.0682), (4, 4, 0.0722)):
        d.observe_first_token(local=True, tokens=tokens, seconds=seconds, queued_tokens=queued)
    _remote, local = d.costs(DisaggInputs(prompt_tokens=2077))
    assert local < 1.0  # 0.48 s: the measured wait plus the prior rate and the stall charge (it was 5.6 s)


def test_a_slope_the_observations_pin_down_is_fitted_even_far_from_the_prior() -> None:
    """A worker ten times slower than the prior, seen over prompts of 100 to 2,000 tokens with 5 ms of noise: its
    own rate, not the prior's."""
    fit = OnlineLinearFit(LinearEstimate(0.0, 20_000.0), halflife_observations=50, one_size="overhead")
    noise = [0.005, -0.004, 0.002, -0.005, 0.003, 0.0, -0.002, 0.004]
    for i, tokens in enumerate((100, 2000, 500, 1500, 1000, 300, 1800, 800)):
        fit.observe(tokens, 0.03 + tokens / 2000 + noise[i])
    line = fit.estimate()
    assert line.tokens_per_s == pytest.approx(2000, rel=0.05) and line.overhead_s == pytest.approx(0.03, abs=0.01)


# -- a path priced on a few slow observations is tried again (issue 13 item 2) ----------------------------------------

# The decode worker holds most of the prompt: at the priors it stays local (local ~35 ms against remote ~85 ms).
_HELD = DisaggInputs(prompt_tokens=600, decode_cached_tokens=512, decode_running=2)


def _serve(
    d: DisaggDecider, requests: int, *, local_s: float, remote_s: float = 0.07, tail_s: float = 0.012
) -> list[bool]:
    """``requests`` requests of ``_HELD``, each decided, sent (``dispatched``) and observed on the path it took, as
    the router and the decode watch do; the workers take ``local_s`` to prefill locally, ``remote_s`` + ``tail_s``
    remotely. Returns the choices (True: remote)."""
    choices = []
    for _ in range(requests):
        remote = d.decide(_HELD).remote
        d.dispatched(local=not remote)
        if remote:
            d.observe_prefill(600, remote_s)
            d.observe_first_token(local=False, tokens=88, seconds=tail_s)
        else:
            d.observe_first_token(local=True, tokens=88, seconds=local_s)
        choices.append(remote)
    return choices


def _slow_start(**settings: object) -> DisaggDecider:
    """Three slow local prefills first (a cold start, a busy machine): local looks 0.2 s, so the next goes remote."""
    d = decider(**settings)
    assert not d.decide(_HELD).remote
    for _ in range(3):
        d.dispatched(local=True)
        d.observe_first_token(local=True, tokens=88, seconds=0.2)
    assert d.decide(_HELD).remote
    return d


def test_a_local_path_priced_on_slow_early_prefills_is_tried_again_and_recovers() -> None:
    """Only local requests measure local prefill: priced on three slow ones, every later request went remote and
    nothing corrected the price within ``estimate_ttl_s`` (the P/D simulator's 98%-remote run). While requests keep
    going remote the local line moves back toward its prior; one goes local, is measured fast, and outweighs the stale
    ones: most requests are local again."""
    d = _slow_start()
    choices = _serve(d, 400, local_s=0.03)
    first_local = choices.index(False)
    assert first_local <= 100
    assert choices[-100:].count(False) >= 95
    assert d.estimates().local_observations > 3


def test_without_aging_a_slowly_priced_path_is_never_tried_again() -> None:
    """The trap itself, kept by ``unobserved_halflife_requests: null`` (the TTL alone, which never fires here)."""
    d = _slow_start(unobserved_halflife_requests=None)
    assert all(_serve(d, 400, local_s=0.03))


def test_a_path_that_really_is_slower_is_only_probed_rarely() -> None:
    """Local prefill really costs 0.2 s here: it is tried again, in a bounded share of requests that shrinks with the
    price gap, and each try puts its price back up."""
    d = _slow_start()
    choices = _serve(d, 1000, local_s=0.2)
    probes = choices.count(False)
    assert 1 <= probes <= 1000 // 32
    remote, local = d.costs(_HELD)
    assert remote < local


def test_aging_is_counted_in_requests_sent_the_other_way_and_fades_old_evidence() -> None:
    d = decider(unobserved_halflife_requests=10, halflife_observations=1e12)  # no forgetting by count: weights 1
    for _ in range(3):
        d.observe_first_token(local=True, tokens=88, seconds=0.2)
    fitted = d.estimates().local
    assert fitted is not None
    for _ in range(10):
        d.dispatched(local=False)
    prior = d._local_prior(d.prefill.estimate())
    halfway = d.estimates().local
    assert halfway is not None
    assert halfway.seconds(88) == pytest.approx((fitted.seconds(88) + prior.seconds(88)) / 2)
    d.decide(_HELD)
    d.costs(_HELD)
    assert d.estimates().local == halfway  # pricing is not sending: nothing ages
    d.dispatched(local=True)  # sent local: its line is the fit again until measured ...
    assert d.estimates().local == fitted
    d.observe_first_token(local=True, tokens=88, seconds=0.03)  # ... and the fresh measurement weighs 1 against 1.5
    line = d.estimates().local
    assert line is not None
    assert line.seconds(88) == pytest.approx((1.5 * 0.2 + 1.0 * 0.03) / 2.5)


def test_aging_only_lowers_a_price() -> None:
    """A line measured cheaper than its prior keeps its measurement however long its path goes unused; a line dearer
    in one part only (here its overhead) moves in that part."""
    d = decider(unobserved_halflife_requests=10)
    for tokens in (1000, 2000, 3000):  # 5 ms + 50k tokens/s: cheaper than the prior (20 ms, 10k tokens/s)
        d.observe_prefill(tokens, 0.005 + tokens / 50_000)
    fast = d.estimates().prefill
    for tokens in (1000, 2000, 3000):  # 50 ms + 400k tokens/s: dearer overhead, cheaper rate than the prior
        d.observe_transfer(tokens, 0.05 + tokens / 400_000)
    transfer = d.estimates().transfer
    for _ in range(100):
        d.dispatched(local=True)
    assert d.evidence_weight(remote=True) == pytest.approx(0.5**10)
    assert d.estimates().prefill == fast
    aged = d.estimates().transfer
    assert aged.tokens_per_s == pytest.approx(transfer.tokens_per_s)
    assert aged.overhead_s == pytest.approx(0.005 + 0.5**10 * (transfer.overhead_s - 0.005))
