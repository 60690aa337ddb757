"""Conditional disaggregation: prefill this request on a prefill worker (remote) or on its decode worker (local)?

Pure and deterministic: observations in (``observe_prefill``, ``observe_transfer(s)``, ``observe_first_token``,
``observe_decode_gap``), decisions out (``decide``).

The cost model, in seconds (``rate``, ``overhead`` and the transfer line are fitted online, see below)::

    remote = queued prefill tokens on the prefill worker / rate          (wait for its backlog)
           + overhead + tokens the prefill worker lacks / rate          (compute)
           + transfer(tokens the decode worker lacks)                   (the decode worker pulls only what it lacks;
                                                                         once measured: remote_tail, pull + first step)
           + shared_compute * decode_time_weight * (1 + requests running there) * (tokens the prefill worker lacks / rate)
    local  = local(queued local prefill tokens + tokens the decode worker lacks)   (the request's own wait)
           + decode_time_weight * (1 + requests running there) * (tokens it lacks / local rate)

``local rate`` is the prefill line's rate times ``local_prefill_speed``. ``local(...)`` is that rate with no overhead
until local prefills are observed, then the line fitted from them (below).

The last line is what disaggregation exists to avoid: while a decode worker prefills, the requests it is decoding
stall, and the time is taken from the decode pool. Remote wins when ``remote < local``. There is no token threshold:
the crossover follows from the measured overhead, transfer cost and backlog (with the default priors, an idle
cluster sends prompts above about 260 uncached tokens to a prefill worker; a saturated prefill pool or a prompt the
decode worker already holds stays local).

Shared compute (``shared_compute``, 0 to 1; ``litellm-disagg up`` computes it): when the prefill and decode workers
are engines on one machine, a remote prefill takes part of the decode workers' compute too: all of it when they
time-share one GPU (1), part of it when CPU engines' threads outnumber the cores (``1 - cores / threads``). The line
with ``shared_compute`` charges the remote option that share of the stall, for the tokens the prefill worker computes.
At 1, remote wins only by what it saves (the prefill worker holds more of the prompt, or the decode worker has a
longer backlog), never by prompt length alone; at 0 (separate hardware) the line vanishes. Measured on 3 one-thread
vLLM engines on 2 CPU cores (docs/benchmarks.md, "P/D on real vLLM CPU workers"): at 0, ~150 lacking tokens priced
~0.75 s local against ~0.4 s remote sent most requests to the one prefill worker.

Online estimates: ``seconds = overhead + tokens / rate``, fitted by least squares with exponential forgetting
(``halflife_observations``), separately for prefill (tokens: prompt tokens computed plus tokens queued ahead when it
was sent) and for KV transfer (tokens moved). The configured priors hold until observations replace them (see
``OnlineLinearFit``), so estimates are defined from the start and converge to what is measured. Prefill observations
come one per remote prefill (the orchestrator times it); transfer observations come from the decode workers' own
NIXL counters, aggregated between two scrapes (``observe_transfers``, fed by the load scraper): the mean request of
the interval, weighted as the requests it stands for, so both estimates forget at the pace of requests.
``estimates()`` returns the current lines.

Both paths observed (``decode_watch.py``): each request's time from being handed to its decode worker to its first
streamed token. A local request's is its whole prefill there (queue, compute, first step): the ``local`` line, on
tokens lacked plus tokens queued there. A remote one's is what follows its remote prefill (pull, first step): the
``remote_tail`` line, on tokens pulled, which replaces the transfer term once observed. Both keep the rate of the
line they refine when their observations are of one size (``one_size="overhead"``): what one size shows is a fixed
wait, not a rate. Before this, only remote prefills were observed: with every request local, the local price stayed a
prior (measured on real vLLM: 85 ms predicted against 1.5-1.8 s).

The stall charge's weight (``decode_time_weight``) is measured too when ``fit_decode_time_weight``: from the streams'
inter-token gaps with and without a local prefill on their worker (``stall_fit.py``: ``1 - base gap / gap during a
prefill``), once enough of each are seen; the configured value is its prior.

Expiry: a remote line is observed only when requests go remote, the local line only when they stay. A line that once looked slow would keep
every request local, and so unobserved, for good (seen: after a prefill worker's restart, its first slow answer kept
`up` prefilling on the decode worker). So a line with no new observation for ``estimate_ttl_s`` goes back to its
prior, which sends the next long prompt remote and measures again: at most one probe per ``estimate_ttl_s`` while
local prefill really is cheaper. The first-token lines expire the same way. The stall fit does not expire.

Aging, in requests (``unobserved_halflife_requests``, ``dispatched``): the TTL lets a stale line rule for its whole
length, 480 requests at 8 per second. Slow local prefills early in a P/D simulator run priced local's overhead at 81 ms
(31-32 ms in every other run) and 98% of that run's requests went remote: no local request measured it again before the
run's end (docs/benchmarks.md, "P/D on the fixed simulator"). So the router reports each priced request's path, and
while requests go one way in a row the other way's fitted lines move toward their priors where those are cheaper (local:
its first-token line; remote: the prefill, transfer and remote-tail lines), halfway every
``unobserved_halflife_requests`` of them: aging only lowers a price, to try a path again, never raises one that was
measured cheap. Once the aged price wins, one request takes that path; its old observations are faded by the weight they
had come to, so its measurement corrects them as much as the price had discounted them. A path that really is slower is
tried again after about ``halflife x log2((its fitted price - its prior price) / (other path's price - its prior
price))`` requests: rarely when it loses by far, more often in a near tie, where a wrong try costs little. A path that
loses even at its prior's price is not tried again by aging (its TTL still resets it). ``decide`` and ``costs`` change
nothing.

Overrides: ``mode: always`` / ``never``; in ``auto``, ``min_remote_prefill_tokens`` (when set) replaces the cost
model by a plain threshold on the tokens the decode worker lacks.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from litellm_disagg.routing.kv.moments import add_fields
from litellm_disagg.routing.kv.settings import DisaggDecisionSettings
from litellm_disagg.routing.kv.stall_fit import GapMoments, StallFit

logger = logging.getLogger(__name__)

_MIN_SECONDS_PER_TOKEN = 1e-12


NO_PREFILL_WORKER = "no prefill worker"
"""The decision's reason when no prefill worker is available (a fallback, not a choice)."""


@dataclass(frozen=True)
class LinearEstimate:
    """``seconds = overhead_s + tokens / tokens_per_s``."""

    overhead_s: float
    tokens_per_s: float

    def seconds(self, tokens: float) -> float:
        return self.overhead_s + max(0.0, tokens) / self.tokens_per_s


@dataclass(frozen=True, slots=True)
class LineMoments:
    """A fit's weighted sums (weight, Σx, Σy, Σx², Σxy, Σy²) and its observation count: what it publishes to the other
    proxy replicas, and what theirs add to its own (``OnlineLinearFit.others``). Sums of several fits' moments are
    the moments of all their observations together."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    yy: float = 0.0
    observations: int = 0

    __add__ = add_fields


class OnlineLinearFit:
    """Exponentially weighted least squares of ``seconds`` on ``tokens``, falling back on a prior line.

    - no observation yet: the prior;
    - observations of (nearly) one size, which cannot tell overhead from rate: the prior overhead (or less, if the
      observations are faster than it) and the rate that puts the line through their weighted mean; with
      ``one_size="overhead"``, the prior rate and the overhead that puts the line through the mean instead (for a
      line whose rate is known from elsewhere and whose observations add a fixed wait: the first-token lines);
    - observations of varied sizes (coefficient of variation of at least ``MIN_SPREAD``) that pin the slope down (its
      standard error at most ``MAX_SLOPE_ERROR`` times the prior's seconds per token): the fitted line (flat when
      size does not matter, through the origin when the fit's overhead would be negative); sizes that vary too
      little for their timing's noise count as one size (above). Without that test, four first tokens of 4 and 8
      prompt tokens, 52-72 ms each, fitted 360 tokens/s on a worker that prefills 20,000: a 2,000-token prompt priced
      at 5.6 s kept a proxy replica off local prefill for its whole run (docs/benchmarks.md, "Four replicas").

    ``others``: the other proxy replicas' moments of the same line (``shared_estimates.py``), added to this fit's own
    in every estimate. ``observe``, ``fade`` and ``reset`` change only this replica's own.
    """

    MIN_SPREAD = 0.1
    MIN_OBSERVATIONS = 3
    MAX_SLOPE_ERROR = 1.0

    def __init__(
        self,
        prior: LinearEstimate,
        *,
        halflife_observations: float,
        one_size: Literal["rate", "overhead"] = "rate",
    ):
        self.prior = prior
        self.one_size = one_size
        self.decay = 0.5 ** (1.0 / halflife_observations)
        self.observations = 0
        """This replica's own observations (calls to ``observe``); ``pooled_observations`` adds the others'."""
        self._w = self._x = self._y = self._xx = self._xy = self._yy = 0.0
        self._others: LineMoments | None = None
        self._pooled: LineMoments | None = None
        """Own plus others' moments, kept until either changes (``estimate`` runs several times per decision)."""

    @property
    def others(self) -> LineMoments | None:
        return self._others

    @others.setter
    def others(self, others: LineMoments | None) -> None:
        self._others, self._pooled = others, None

    @property
    def pooled_observations(self) -> int:
        return self.observations + (self._others.observations if self._others is not None else 0)

    def pooled(self) -> LineMoments:
        """This replica's moments plus the others'."""
        if self._pooled is None:
            own = self.moments()
            self._pooled = own if self._others is None else own + self._others
        return self._pooled

    def moments(self) -> LineMoments:
        """This replica's own moments (never the others': each replica publishes only what it observed)."""
        return LineMoments(self._w, self._x, self._y, self._xx, self._xy, self._yy, self.observations)

    def observe(self, tokens: float, seconds: float, *, weight: float = 1.0) -> None:
        """One observation; with ``weight``, that many observations of this size and duration in a row (a batch
        known only by its mean; fractional weights allowed). ``observations`` counts calls."""
        if not (tokens >= 0 and seconds >= 0 and weight > 0) or not math.isfinite(tokens + seconds + weight):
            return
        d = self.decay
        keep = d**weight  # ``weight`` updates in a row: old sums decay ``weight`` times, the new point adds up
        added = (1.0 - keep) / (1.0 - d) if d < 1.0 else weight  # 1 + d + ... + d**(weight - 1); exactly 1 for 1
        self._w = self._w * keep + added
        self._x = self._x * keep + added * tokens
        self._y = self._y * keep + added * seconds
        self._xx = self._xx * keep + added * tokens * tokens
        self._xy = self._xy * keep + added * tokens * seconds
        self._yy = self._yy * keep + added * seconds * seconds
        self.observations += 1
        self._pooled = None

    def fade(self, factor: float) -> None:
        """Weigh every observation so far ``factor`` (0 to 1) times as much against the next ones; the line itself
        does not change until the next observation."""
        factor = min(1.0, max(0.0, factor))
        self._w *= factor
        self._x *= factor
        self._y *= factor
        self._xx *= factor
        self._xy *= factor
        self._yy *= factor
        self._pooled = None
        if self._w <= 0.0:
            self.reset()

    def reset(self) -> None:
        """Forget every observation: the prior again."""
        self.observations = 0
        self._w = self._x = self._y = self._xx = self._xy = self._yy = 0.0
        self._pooled = None

    def estimate(self, prior: LinearEstimate | None = None) -> LinearEstimate:
        """The current line; ``prior`` replaces ``self.prior`` for this call (a prior that follows another line)."""
        prior = self.prior if prior is None else prior
        m = self.pooled()
        if m.observations == 0 or m.w <= 0.0:
            return prior
        w = m.w
        mean_x, mean_y = m.x / w, m.y / w
        var_x = max(0.0, m.xx / w - mean_x * mean_x)
        cov = m.xy / w - mean_x * mean_y
        if (m.observations >= self.MIN_OBSERVATIONS and var_x > (self.MIN_SPREAD * mean_x) ** 2
                and _slope_error(m, mean_y, var_x, cov) <= self.MAX_SLOPE_ERROR / prior.tokens_per_s):
            slope = cov / var_x
            if slope <= _MIN_SECONDS_PER_TOKEN:  # size does not matter: all overhead
                return LinearEstimate(overhead_s=mean_y, tokens_per_s=1.0 / _MIN_SECONDS_PER_TOKEN)
            intercept = mean_y - slope * mean_x
            if intercept < 0.0:  # no overhead to speak of: the line through the origin
                slope = max(m.xy / m.xx, _MIN_SECONDS_PER_TOKEN)
                return LinearEstimate(overhead_s=0.0, tokens_per_s=1.0 / slope)
            return LinearEstimate(overhead_s=intercept, tokens_per_s=1.0 / slope)
        if mean_x <= 0.0:
            return LinearEstimate(overhead_s=mean_y, tokens_per_s=prior.tokens_per_s)
        if self.one_size == "overhead":
            overhead = mean_y - mean_x / prior.tokens_per_s
            if overhead >= 0.0:
                return LinearEstimate(overhead_s=overhead, tokens_per_s=prior.tokens_per_s)
            return LinearEstimate(overhead_s=0.0, tokens_per_s=mean_x / max(mean_y, _MIN_SECONDS_PER_TOKEN))
        intercept = min(prior.overhead_s, mean_y)
        slope = max((mean_y - intercept) / mean_x, _MIN_SECONDS_PER_TOKEN)
        return LinearEstimate(overhead_s=intercept, tokens_per_s=1.0 / slope)


def _slope_error(m: LineMoments, mean_y: float, var_x: float, cov: float) -> float:
    """The least-squares slope's standard error (seconds per token), the weights counted as observations; infinite
    with two or fewer, where a line fits any points."""
    if m.w <= 2.0:
        return math.inf
    residual = max(0.0, m.yy / m.w - mean_y * mean_y - cov * cov / var_x)
    return math.sqrt(residual / (var_x * (m.w - 2.0)))


def toward(prior: LinearEstimate, line: LinearEstimate, weight: float) -> LinearEstimate:
    """``line`` where ``weight`` is 1, ``prior`` where it is 0 and cheaper: the overhead and the seconds per token
    each move linearly toward the prior's where the prior's is lower, else stay the line's. Aging only ever lowers a
    price: it is there to try a path again, not to doubt one whose measurements say it is cheap."""
    if weight >= 1.0 or line == prior:
        return line
    weight = max(0.0, weight)
    line_per_token, prior_per_token = 1.0 / line.tokens_per_s, 1.0 / prior.tokens_per_s
    per_token = min(line_per_token, prior_per_token + weight * (line_per_token - prior_per_token))
    return LinearEstimate(
        overhead_s=min(line.overhead_s, prior.overhead_s + weight * (line.overhead_s - prior.overhead_s)),
        tokens_per_s=1.0 / max(per_token, _MIN_SECONDS_PER_TOKEN),
    )


@dataclass(slots=True)
class PathStreak:
    """The requests sent the same way in a row, up to the latest (``dispatched``)."""

    remote: bool
    requests: int


@dataclass(frozen=True)
class DisaggEstimates:
    """The decider's current lines, and how many observations (calls) each rests on (0: still the prior)."""

    prefill: LinearEstimate
    transfer: LinearEstimate
    prefill_observations: int
    transfer_observations: int
    local: LinearEstimate | None = None
    """A local prefill's time to first token on its decode worker (``FIRST_TOKEN_LINES``)."""
    remote_tail: LinearEstimate | None = None
    """After a remote prefill, its decode worker's time to first token (pull and first step)."""
    local_observations: int = 0
    remote_tail_observations: int = 0
    decode_time_weight: float | None = None
    """The stall charge's weight in use: fitted from inter-token gaps (``stall_fit.py``) or the configured prior."""
    decode_time_weight_fitted: bool = False
    streak: PathStreak | None = None
    """The latest requests sent one way in a row: the other way's lines are aged by them (the module's docstring)."""


@dataclass(frozen=True, slots=True)
class DeciderMoments:
    """One replica's own observations, as sums (``DisaggDecider.moments``): published to the other replicas, and
    theirs summed (``+``) for ``DisaggDecider.set_others``. The transfer line is not among them: every replica
    scrapes the same decode workers' NIXL counters, so each already has every transfer (pooled, each would count N
    times)."""

    prefill: LineMoments = LineMoments()
    local: LineMoments = LineMoments()
    remote_tail: LineMoments = LineMoments()
    stall: GapMoments = GapMoments()

    __add__ = add_fields


@dataclass(frozen=True)
class DisaggInputs:
    """One request's situation, as the router sees it after choosing the decode and the best prefill worker."""

    prompt_tokens: int
    decode_cached_tokens: int = 0
    """Prompt tokens the chosen decode worker's prefix cache already holds."""
    prefill_cached_tokens: int = 0
    """Prompt tokens the best prefill worker's prefix cache already holds."""
    prefill_queued_tokens: int = 0
    """Prompt tokens waiting to be prefilled on that prefill worker (its backlog)."""
    decode_queued_tokens: int = 0
    """Prompt tokens the decode worker is still prefilling locally for other requests."""
    decode_running: float = 0.0
    """Requests running on the decode worker (they stall while it prefills)."""
    prefill_available: bool = True


@dataclass(frozen=True)
class DisaggDecision:
    remote: bool
    reason: str
    remote_cost_s: float | None = None
    local_cost_s: float | None = None
    inputs: DisaggInputs | None = None
    """What was priced (the first-token observation of this request needs its tokens and the decode backlog)."""


class DisaggDecider:
    def __init__(self, settings: DisaggDecisionSettings, *, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self._observed_at: dict[str, float] = {}
        """When each line (``prefill``, ``transfer``) last had an observation."""
        self.prefill = OnlineLinearFit(
            LinearEstimate(settings.prior_prefill_overhead_s, settings.prior_prefill_tokens_per_s),
            halflife_observations=settings.halflife_observations,
        )
        self.transfer = OnlineLinearFit(
            LinearEstimate(settings.prior_transfer_overhead_s, settings.prior_transfer_tokens_per_s),
            halflife_observations=settings.halflife_observations,
        )
        # The first-token lines' priors follow the lines above (``costs``): this one is never used as such.
        placeholder = LinearEstimate(0.0, settings.prior_prefill_tokens_per_s)
        self.local = OnlineLinearFit(
            placeholder, halflife_observations=settings.halflife_observations, one_size="overhead"
        )
        """A local prefill's time to first token, on (tokens it lacked + tokens queued on its decode worker)."""
        self.remote_tail = OnlineLinearFit(
            placeholder, halflife_observations=settings.halflife_observations, one_size="overhead"
        )
        """After a remote prefill's response, its decode worker's time to first token, on the tokens it pulled."""
        self.stall = StallFit(halflife_gaps=settings.stall_halflife_gaps, min_gaps=settings.stall_min_gaps)
        """Inter-token gaps with and without a local prefill on the worker: ``decode_time_weight`` measured."""
        self._streak: PathStreak | None = None

    # -- requests sent (the router, once a request's path is final) ---------------------------------------------------

    def dispatched(self, *, local: bool) -> None:
        """A request was sent on its path: local (prefilled on its decode worker) or remote. Requests sent one way in
        a row age the other way's lines (``evidence_weight``); when that way is taken again, its old observations
        are faded by the weight they had come to, so its next observation corrects them as much as the price had
        already discounted them."""
        remote = not local
        streak = self._streak
        if streak is not None and streak.remote is remote:
            streak.requests += 1
            return
        weight = self.evidence_weight(remote=remote)
        if weight < 1.0:
            for fit in self._path_fits(remote=remote):
                fit.fade(weight)
        self._streak = PathStreak(remote=remote, requests=1)

    def evidence_weight(self, *, remote: bool) -> float:
        """How much a path's fitted lines count against their priors: 1, halved every
        ``unobserved_halflife_requests`` requests sent the other way in a row."""
        halflife, streak = self.settings.unobserved_halflife_requests, self._streak
        if halflife is None or streak is None or streak.remote is remote:
            return 1.0
        return 0.5 ** (streak.requests / halflife)

    def _path_fits(self, *, remote: bool) -> tuple[OnlineLinearFit, ...]:
        return (self.prefill, self.transfer, self.remote_tail) if remote else (self.local,)

    # -- observations (the orchestrator, after each prefill / transfer) -----------------------------------------------

    def observe_prefill(self, computed_tokens: int, seconds: float, *, queued_tokens: int = 0) -> None:
        """A remote prefill took ``seconds`` from sending to its response; it computed ``computed_tokens`` (prompt
        minus the prefill worker's cache hit) behind ``queued_tokens`` already waiting there."""
        self.prefill.observe(computed_tokens + queued_tokens, seconds)
        self._observed_at["prefill"] = self._clock()

    def observe_first_token(self, *, local: bool, tokens: int, seconds: float, queued_tokens: int = 0) -> None:
        """A request's decode worker answered its first token ``seconds`` after the request was sent to it.
        ``local``: it prefilled ``tokens`` (what it lacked) itself behind ``queued_tokens`` queued there; else the
        prompt was prefilled remotely and it pulled ``tokens`` (``queued_tokens`` is not used)."""
        if local:
            self.local.observe(tokens + queued_tokens, seconds)
            self._observed_at["local"] = self._clock()
        else:
            self.remote_tail.observe(tokens, seconds)
            self._observed_at["remote_tail"] = self._clock()

    def observe_decode_gap(self, seconds: float, *, during_prefill: bool) -> None:
        """A running request's inter-token gap; ``during_prefill``: its worker prefilled a prompt meanwhile."""
        self.stall.observe(seconds, during_prefill=during_prefill)

    def decode_time_weight(self) -> tuple[float, bool]:
        """The stall charge's weight and whether it is measured (``fit_decode_time_weight`` and enough gaps of both
        kinds), else the configured ``decode_time_weight``."""
        if self.settings.fit_decode_time_weight:
            fitted = self.stall.estimate().weight
            if fitted is not None:
                return fitted, True
        return self.settings.decode_time_weight, False

    def observe_transfer(self, tokens: int, seconds: float) -> None:
        """A decode worker pulled ``tokens`` tokens' worth of KV in ``seconds``."""
        self.transfer.observe(tokens, seconds)
        self._observed_at["transfer"] = self._clock()

    def observe_transfers(
        self, *, transfers: float, seconds: float, tokens: float, handles_per_request: float = 1.0
    ) -> None:
        """A decode worker's counters over an interval: ``transfers`` NIXL transfer handles completed, taking
        ``seconds`` in all, and ``tokens`` prompt tokens arrived by transfer. Each request used
        ``handles_per_request`` handles in parallel (one per tensor-parallel rank of the decode worker), so this is
        ``transfers / handles_per_request`` requests of ``tokens`` / requests tokens each, each waiting the mean
        handle's time ``seconds / transfers``: one observation of that mean request, weighted by the requests."""
        if not (transfers > 0 and handles_per_request > 0 and tokens >= 0 and seconds >= 0):
            return
        requests = transfers / handles_per_request
        self.transfer.observe(tokens / requests, seconds / transfers, weight=requests)
        self._observed_at["transfer"] = self._clock()

    def _expire(self) -> None:
        """Lines without an observation for ``estimate_ttl_s`` go back to their priors (the module's docstring)."""
        ttl = self.settings.estimate_ttl_s
        if ttl is None or not self._observed_at:
            return
        now = self._clock()
        for name, fit in self._lines():
            at = self._observed_at.get(name)
            if at is not None and now - at > ttl:
                del self._observed_at[name]
                if fit.observations:
                    logger.info("no %s observation for %.0f s: its estimate is back to the prior (%s)",
                                name, now - at, fit.prior)
                fit.reset()

    def _lines(self) -> tuple[tuple[str, OnlineLinearFit], ...]:
        return (
            ("prefill", self.prefill), ("transfer", self.transfer), ("local", self.local),
            ("remote_tail", self.remote_tail),
        )

    def estimates(self) -> DisaggEstimates:
        """The lines in use: fitted, aged toward their priors by requests sent the other way (``evidence_weight``)."""
        prefill, transfer, local, remote_tail = self._lines_in_use()
        weight, fitted = self.decode_time_weight()
        streak = self._streak
        return DisaggEstimates(
            decode_time_weight=weight,
            decode_time_weight_fitted=fitted,
            prefill=prefill,
            transfer=transfer,
            prefill_observations=self.prefill.pooled_observations,
            transfer_observations=self.transfer.pooled_observations,
            local=local,
            remote_tail=remote_tail,
            local_observations=self.local.pooled_observations,
            remote_tail_observations=self.remote_tail.pooled_observations,
            streak=None if streak is None else PathStreak(streak.remote, streak.requests),
        )

    def _lines_in_use(self) -> tuple[LinearEstimate, LinearEstimate, LinearEstimate, LinearEstimate]:
        """``(prefill, transfer, local, remote_tail)``: each fitted line moved toward its prior (where cheaper) by its
        path's ``evidence_weight`` (the remote tail, fitted on the transfer line, toward the transfer prior; the local
        line toward the prefill line's rate)."""
        self._expire()
        remote_w, local_w = self.evidence_weight(remote=True), self.evidence_weight(remote=False)
        fitted_transfer = self.transfer.estimate()
        prefill = toward(self.prefill.prior, self.prefill.estimate(), remote_w)
        transfer = toward(self.transfer.prior, fitted_transfer, remote_w)
        remote_tail = toward(self.transfer.prior, self.remote_tail.estimate(fitted_transfer), remote_w)
        local_prior = self._local_prior(prefill)
        local = toward(local_prior, self.local.estimate(local_prior), local_w)
        return prefill, transfer, local, remote_tail

    def _local_prior(self, prefill: LinearEstimate) -> LinearEstimate:
        """Until local prefills are observed: the prefill line's rate at ``local_prefill_speed``, no overhead."""
        return LinearEstimate(0.0, prefill.tokens_per_s * self.settings.local_prefill_speed)

    # -- other proxy replicas (``shared_estimates.py``) ---------------------------------------------------------------

    def moments(self) -> DeciderMoments:
        """What this replica observed itself: every line's moments and the stall fit's gap sums."""
        return DeciderMoments(
            prefill=self.prefill.moments(), local=self.local.moments(), remote_tail=self.remote_tail.moments(),
            stall=self.stall.moments(),
        )

    def set_others(self, others: DeciderMoments | None) -> None:
        """The other replicas' moments, summed (None: none, or not known): every estimate adds them to this
        replica's own, so N replicas each fit on all N's observations instead of a Nth of them."""
        self.prefill.others = None if others is None else others.prefill
        self.local.others = None if others is None else others.local
        self.remote_tail.others = None if others is None else others.remote_tail
        self.stall.others = None if others is None else others.stall

    # -- decision -----------------------------------------------------------------------------------------------------

    def decide(self, inputs: DisaggInputs) -> DisaggDecision:
        s = self.settings
        if s.mode == "never":
            return DisaggDecision(False, "mode never", inputs=inputs)
        if not inputs.prefill_available:
            return DisaggDecision(False, NO_PREFILL_WORKER, inputs=inputs)
        if s.mode == "always":
            return DisaggDecision(True, "mode always", inputs=inputs)
        lacking_local = max(0, inputs.prompt_tokens - inputs.decode_cached_tokens)
        if s.min_remote_prefill_tokens is not None:
            remote = lacking_local >= s.min_remote_prefill_tokens
            verdict = ">=" if remote else "<"
            return DisaggDecision(
                remote, f"override: {lacking_local} uncached tokens {verdict} {s.min_remote_prefill_tokens}",
                inputs=inputs,
            )
        remote_cost, local_cost = self.costs(inputs)
        shared = f", shared compute {s.shared_compute:g}" if s.shared_compute else ""
        if remote_cost < local_cost:
            return DisaggDecision(
                True, f"remote {remote_cost * 1e3:.1f} ms < local {local_cost * 1e3:.1f} ms{shared}", remote_cost,
                local_cost, inputs,
            )
        return DisaggDecision(
            False, f"local {local_cost * 1e3:.1f} ms <= remote {remote_cost * 1e3:.1f} ms{shared}", remote_cost,
            local_cost, inputs,
        )

    def costs(self, inputs: DisaggInputs) -> tuple[float, float]:
        """``(remote, local)`` costs in seconds, as in the module's docstring."""
        prefill, transfer, local_line, remote_tail = self._lines_in_use()
        lacking_remote = max(0, inputs.prompt_tokens - inputs.prefill_cached_tokens)
        lacking_local = max(0, inputs.prompt_tokens - inputs.decode_cached_tokens)
        remote = inputs.prefill_queued_tokens / prefill.tokens_per_s + prefill.seconds(lacking_remote)
        if self.remote_tail.pooled_observations:  # measured: the pull and the first step on the decode worker
            remote += remote_tail.seconds(lacking_local)
        elif lacking_local > 0:
            remote += transfer.seconds(lacking_local)
        stall_per_second = self.decode_time_weight()[0] * (1.0 + max(0.0, inputs.decode_running))
        # The share of the prefill worker's compute taken from the decode workers (same cores / GPU).
        remote += self.settings.shared_compute * stall_per_second * lacking_remote / prefill.tokens_per_s
        local_rate = prefill.tokens_per_s * self.settings.local_prefill_speed
        local_compute = lacking_local / local_rate
        # The request's own wait: measured once local prefills are observed (``local``), else compute alone.
        local = local_line.seconds(inputs.decode_queued_tokens + lacking_local) + stall_per_second * local_compute
        return remote, local
