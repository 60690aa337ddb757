"""The planner's decision core: signals in, decisions out; no I/O, no clock of its own.

    Planner(settings).step(signals, now) -> PlannerStep
        per model: pressures ─► condition ─► hysteresis ─► guards (flip in progress, cooldown, minimum pools)
                   ─► role moves ─► desired pool sizes (and a worker to drain when they shrink)

How it decides, per served model, at every step:

1. **Pressures**, dimensionless, 1.0 = exactly at the SLO (``planner.ttft_ms``, ``planner.itl_ms``):

   - prefill pressure = max(prefill-time percentile / TTFT SLO, estimated prefill queue wait / TTFT SLO), where the
     wait is the prefill pool's queued prompt tokens over its measured throughput (skipped while the rate is
     unknown), and the prefill time is arrival to the prefill's answer (``ModelSignals.prefill_time``). Without a
     prefill-time window the TTFT percentile stands in, except while the decode side is full (occupancy or KV term
     >= 1): then TTFT holds decode-side waits (pulls queued for KV) and is no prefill evidence. A third term is the
     queue's *trend* (``trend.py``): while the queue grows, the wait it will reach ``window_s`` from now at the measured
     demand (``serving workers x rate + growth``), on the pool after the flips in progress; it sees a missing worker
     seconds before the wait itself passes the SLO;
   - decode pressure = max(ITL percentile / ITL SLO, decode batch occupancy / ``occupancy_high``,
     decode KV usage / ``kv_usage_high``); the largest term is the decode *driver* (``itl``, ``occupancy``, ``kv``).

   A latency percentile over fewer than ``min_samples`` requests is no evidence; with no evidence a side's pressure
   is 0 (idle). Transfer share = transfer-time percentile / TTFT SLO.

2. **Condition** (first that holds):

   ============== ======================================================== =================================
   condition      when                                                     move
   ============== ======================================================== =================================
   aggregation_   (with ``engine_profile``) some worker is not ``both``, a  prefill, then decode -> both, up
   pays           side's pressure is over 1, and every worker as ``both``   to ``max_moves_per_step`` a step;
                  at the measured load would hold the ITL under             it goes on at the next steps
                  ``headroom`` of its SLO and keep up with its prompts      (no hysteresis, no settling
                  (``mixing.py``: the split fails a load aggregated         window) while the estimate
                  serving would hold)                                       holds
   aggregation_   a crossing decided on the prefill side (its pressure      the ``both`` workers back to that
   refuted        over 1) whose settled all-``both`` layout at the same     split at once, cooldown skipped;
                  load shows, in two readings a window apart, a prefill     ``aggregation_pays`` then off
                  pressure still over 1, no lower than the split's and      until the load is clearly lighter
                  not falling (``refutation.py``)
   disaggregation (with ``engine_profile``) ``both`` workers serve, ITL > 1  ``both`` -> decode, then ``both``
   _pays          while the decode side's capacity terms are under          -> prefill, toward that split, up
                  ``headroom`` and prefill >= ``aggregate_below`` (the      to ``max_moves_per_step`` a step;
                  evidence of ``mixing_costly``, all-``both`` included),    it goes on at the next steps (no
                  and the profile sizes a split of the model's workers      hysteresis, no settling window)
                  that holds the load (prefill workers busy at most         while that split still holds the
                  ``aggregate_busy_max``, decode ITL under ``headroom``;    load within the SLO itself
                  of those, the most room on its tighter side, at least
                  2 decode workers: ``mixing.sized_split``), while the
                  estimate for all-``both`` misses the band's middle
   mixing_costly  ``both`` workers beside prefill or decode workers, ITL    every ``both`` worker (up to
                  > 1 while the decode side's capacity terms (occupancy,    ``max_moves_per_step``) -> prefill;
                  KV) are under ``headroom``, prefill >= ``aggregate_below``  -> decode when no decode worker would
                                                                           pull from them or the decode side's
                                                                           capacity terms would reach ``headroom``
   overloaded     a side is above 1 and the other has no headroom          none (desired sizes grow that side)
   prefill_bound  prefill > 1, decode < ``headroom``                       both (beside decode workers), then
                                                                           decode -> prefill; without decode
                                                                           workers none (every worker prefills
                                                                           its own prompts already: a worker
                                                                           more is desired); none
                                                                           while the queue wait is known, under
                                                                           ``aggregate_below`` and not trending
                                                                           past the SLO (the window holds a past
                                                                           backlog: more workers only shorten a
                                                                           queue)
   decode_bound   decode > 1, prefill < ``headroom``; or (disaggregated)  prefill < ``aggregate_below``:
                  decode >= ``headroom`` and prefill < ``aggregate_below``  prefill, then decode -> both;
                                                                           otherwise ITL-driven: prefill, then both ->
                                                                           decode; KV/occupancy-driven:
                                                                           prefill -> both (its KV joins the
                                                                           decode side, it still prefills), but
                                                                           none while both latencies meet their
                                                                           SLOs (ITL under ``headroom``, TTFT
                                                                           under 1) and prefill is busy
   low_load       both pressures < ``aggregate_below``, the prefill side     prefill, then decode -> both
                  measured or no prompt arriving (``prefill_idle``)
   transfer_costly transfer share > ``transfer_share_max``, both sides     prefill, then decode -> both
                  under ``headroom``
   steady         otherwise                                                none
   ============== ======================================================== =================================

   The gap between ``aggregate_below`` and 1.0 is the hysteresis band in pressure: a layout that went aggregated at
   low load is split again only when a side actually misses its SLO. ``low_load`` and ``transfer_costly`` are the
   "disaggregation does not pay" cases (Dynamo's own notes: it loses at low concurrency, and when the transfer eats
   the TTFT budget); ``decode_bound`` driven by KV is the third (prefill workers' KV sits idle while decodes queue).
   ``aggregation_pays`` is the same answer under load: the other rows read the layout that serves, and from a
   split nothing in them can say what a mixed step would cost; the engine profile can (``mixing.py``). Without a
   profile, or without the load rates, it never holds. The moves to ``both`` are taken only with
   ``allow_aggregated``. ``disaggregation_pays`` is the way back with a profile: from the same evidence as
   ``mixing_costly`` it goes straight to the split the profile sizes, where ``mixing_costly`` (without a profile)
   moves one step at a time and waits out a settling window after each. Both read the mixed-step estimate times the
   model's *mixing correction* (``calibration.py``): a settled window of every worker ``both`` under a steady load
   (``steadiness.py``: a window of bursts never raises it) whose ITL percentile is beyond the estimate's margin
   shows the profile underprices mixing, and by how much. ``mixing_costly`` is the
   way back: "aggregation does not pay". A ``both`` worker mixes prefill chunks into its decode steps; while prompts
   keep arriving (prefill busy) and the decode side's batches and KV are far from full, an ITL over its SLO is those
   mixed steps, not decode work, so the answer is to split the ``both`` workers again, not to take prefill workers
   for decode (which leaves more prompts to the ``both`` workers and stretches the ITL further). It is checked first: an ITL breach beside
   a prefill pressure over 1 is the same mixing (the ``both`` workers' prefill runs at a fraction of a prefill
   worker's rate), not an overload. For the same reason ``prefill_bound`` splits ``both`` workers before it takes
   decode workers. In an all-``both`` layout there is nothing to split back into (a prefill worker beside only
   ``both`` workers gets no prompts: they serve theirs locally), so the rows below decide there.

3. **Hysteresis in time**: the same condition must hold ``hysteresis_steps`` consecutive steps; after a move the
   count starts again, so each further move needs fresh evidence (the latency window then shows the new layout).
   Exception: a ``prefill_bound`` driven by the trend (above 1) of a queue that rose at each of the last
   ``hysteresis_steps`` samples, all on the layout serving now, is that many steps of evidence by itself.

4. **Guards**: no move for a model while one of its workers is flipping; a worker moved less than ``cooldown_s``
   ago is not moved again; a move never leaves fewer than ``min_prefill_workers`` workers able to prefill or
   ``min_decode_workers`` able to decode (``both`` counts for each); a worker is only asked for a role its launch
   serves (``WorkerSignals.servable_roles``, from the published ``allowed_roles``); draining or starting workers
   are in no pool and never moved; no move until ``window_s`` after the model's last move (the latency windows
   still hold the old layout's requests: acting on them overshoots), except for a queue-driven ``prefill_bound``
   (3.) after a move toward prefill or a ``low_load`` move (its samples postdate that move's flips). A ``both``
   worker split back (``mixing_costly``, ``prefill_bound``) skips its cooldown (``splits_back``: it went to ``both``
   under ``aggregate_below`` and leaves on a pressure over 1, that band is the hysteresis; the move back to ``both``
   keeps its cooldown), except a ``mixing_costly`` split of a worker whose move into ``both`` was a ``decode_bound``
   one: the decode side asked for it, and taking it back on the ITL inside the cooldown is the flip-flop the
   cooldown exists to stop (bursts: each burst split back what each quiet period had moved).
   For ``window_s`` after ``mixing_costly`` split the last ``both`` worker, the ITL window holds the mixed layout's
   requests and is left out of the decode pressure (``without_itl``). Moves per step: ``wanted_moves``
   (``prefill_bound`` with a measured trend: the shortfall, workers needed by the demand minus the pool; otherwise
   in proportion to how far the pressed side is over its SLO; all up to ``max_moves_per_step`` when idle prefill
   workers go to ``both``, and every ``both`` worker for ``mixing_costly``: each of them mixes). Among candidates the
   least busy goes first (fewest running, then waiting requests, then worker id: deterministic).

5. **Desired pool sizes** (for an external autoscaler): the layout after this step's moves; plus one worker on the
   side that is above 1 when no move can relieve it (``overloaded``, or a bound condition with no candidate at all);
   minus one when both pressures stayed under ``scale_down_below`` for ``hysteresis_steps`` (then the least busy
   worker of the least pressed side is named to drain first, the same one at every step until it leaves the pool;
   the next removal then needs ``hysteresis_steps`` fresh steps).

The state the planner keeps: per model the current condition's streak, the scale-down streak, the worker named to
drain, the last move (time, condition), the last ``mixing_costly`` split, the prefill queue's samples since the
serving layout changed, the mixing correction (and when it last rose), and the last TTFT-driven crossing to ``both``
(``refutation.py``: its split, and the load at which one was refuted); per worker the time of its last move.
Everything else is a function of ``signals`` and ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from litellm_disagg.planner.calibration import mixing_correction
from litellm_disagg.planner.mixing import (
    MixedEstimate,
    SplitEstimate,
    aggregated_estimate,
    sized_split,
    split_estimate,
)
from litellm_disagg.planner.refutation import TtftRefutation
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.planner.signals import ClusterSignals, ModelSignals, WorkerSignals
from litellm_disagg.planner.steadiness import RateHistory
from litellm_disagg.planner.trend import QueueHistory, QueueTrend
from litellm_disagg.runtime_config import WorkerRole


class Condition(StrEnum):
    AGGREGATION_PAYS = "aggregation_pays"
    AGGREGATION_REFUTED = "aggregation_refuted"
    DISAGGREGATION_PAYS = "disaggregation_pays"
    MIXING_COSTLY = "mixing_costly"
    OVERLOADED = "overloaded"
    PREFILL_BOUND = "prefill_bound"
    DECODE_BOUND = "decode_bound"
    LOW_LOAD = "low_load"
    TRANSFER_COSTLY = "transfer_costly"
    STEADY = "steady"


class DecodeDriver(StrEnum):
    NONE = "none"
    ITL = "itl"
    OCCUPANCY = "occupancy"
    KV = "kv"


@dataclass(frozen=True)
class Pressures:
    """One model's pressures at one step (1.0 = at the SLO) and the terms behind them (None: unknown)."""

    prefill: float
    decode: float
    decode_driver: DecodeDriver
    ttft_ratio: float | None = None
    queue_ratio: float | None = None
    itl_ratio: float | None = None
    occupancy_ratio: float | None = None
    kv_ratio: float | None = None
    transfer_share: float | None = None
    prefill_time_ratio: float | None = None
    trend_ratio: float | None = None
    """The prefill queue's projected wait ``window_s`` from now at its measured growth, over the TTFT SLO."""
    prefill_needed: int | None = None
    """Workers able to prefill that the measured prefill demand needs (``QueueTrend.needed``); None: unknown."""
    aggregated_itl_ratio: float | None = None
    """Every worker as ``both`` at this load: the estimated ITL over its SLO (``mixing.py``); None: not estimated
    (no engine profile or no load rates), inf: the workers would not keep up with their prompts."""
    aggregated_busy: float | None = None
    """The same estimate's share of a worker's time on prompt chunks."""
    split_prefill: int | None = None
    """The split the engine profile sizes for this load (``mixing.sized_split``): its prefill workers, the rest
    decode; None: no profile, no load rates, or no split holds the load."""
    split_itl_ratio: float | None = None
    """That split's estimated decode ITL over its SLO."""
    mixing_correction: float | None = None
    """The factor the aggregated estimate's ITL is multiplied by (``calibration.py``: the profile's own
    ``mixing_correction``, 1.0 unless set, until a settled window of every worker ``both`` moves it); None: no engine
    profile."""
    load_swing: float | None = None
    """The windowed prompt rate's largest over smallest reading over the last ``window_s`` (``steadiness.py``):
    over ``steady_swing_max`` the window does not raise the mixing correction; None: fewer than two readings."""
    prefill_unmeasured: bool = False
    """Nothing measured the prefill side (no TTFT or prefill-time window with ``min_samples``, no queue, no trend:
    ``litellm-disagg planner`` on its own has no queue; at a few requests a second a window holds few first tokens,
    and none while they take longer than it) while prompts arrive (the window's prompt rate, or the one over
    ``window_max_s``, is over zero), the latency window holds first tokens, fewer than ``min_samples`` (prompts
    came; a zero rate is a lull between two), or the planner has not yet seen the model for a whole ``window_s`` (a
    rate read over its first seconds can be zero under load). ``prefill`` then reads 0.0 for want of evidence; ``prefill_idle`` does not count it as
    idle."""
    aggregation_refuted: bool = False
    """A crossing to ``both`` decided on the prefill side was refuted by its first tokens at this load
    (``refutation.py``): ``aggregation_pays`` is off until the prompt rate falls clearly below it."""
    prefill_window_s: float | None = None
    """The seconds the latency window behind the prefill pressure covers (prefill time, else TTFT): over ``window_s``
    where it reached back for ``min_samples`` requests (``window_max_s``); None: no such window, or not known."""

    def prefill_idle(self, settings: PlannerSettings) -> bool:
        """The prefill side is known to be nearly idle: pressure under ``aggregate_below``, and measured (or no
        prompt arriving and no first token over a whole window). What ``low_load`` and the aggregating
        ``decode_bound`` ask (moves that rest on an idle prefill side). The guards that protect a busy prefill side (``mixing_costly``, the
        KV-driven ``decode_bound``) still read the pressure itself: an unmeasured side is not known to be busy
        either."""
        return self.prefill < settings.aggregate_below and not self.prefill_unmeasured

    def as_fields(self) -> dict[str, float | str | None]:
        """Flat fields for a log line or a metric (names are the ``planner_signal`` label values)."""
        return {
            "prefill_pressure": round(self.prefill, 4),
            "decode_pressure": round(self.decode, 4),
            "decode_driver": self.decode_driver.value,
            "ttft_ratio": _round(self.ttft_ratio),
            "queue_ratio": _round(self.queue_ratio),
            "itl_ratio": _round(self.itl_ratio),
            "occupancy_ratio": _round(self.occupancy_ratio),
            "kv_ratio": _round(self.kv_ratio),
            "transfer_share": _round(self.transfer_share),
            "prefill_time_ratio": _round(self.prefill_time_ratio),
            "trend_ratio": _round(self.trend_ratio),
            "prefill_needed": None if self.prefill_needed is None else float(self.prefill_needed),
            "aggregated_itl_ratio": _round(self.aggregated_itl_ratio),
            "aggregated_busy": _round(self.aggregated_busy),
            "split_prefill": None if self.split_prefill is None else float(self.split_prefill),
            "split_itl_ratio": _round(self.split_itl_ratio),
            "mixing_correction": _round(self.mixing_correction),
            "load_swing": _round(self.load_swing),
            "prefill_unmeasured": 1.0 if self.prefill_unmeasured else 0.0,
            "aggregation_refuted": 1.0 if self.aggregation_refuted else 0.0,
            "prefill_window_s": None if self.prefill_window_s is None else round(self.prefill_window_s, 1),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass(frozen=True)
class RoleMove:
    """Move ``worker_id`` from ``from_role`` to ``to_role`` (through ``Registry.request_role``)."""

    worker_id: str
    model: str
    from_role: WorkerRole
    to_role: WorkerRole
    condition: Condition


@dataclass(frozen=True)
class DesiredPools:
    """How many workers of each role the planner wants for one model (for an external autoscaler)."""

    model: str
    prefill: int
    decode: int
    both: int

    @property
    def total(self) -> int:
        return self.prefill + self.decode + self.both

    def of(self, role: WorkerRole) -> int:
        return {WorkerRole.PREFILL: self.prefill, WorkerRole.DECODE: self.decode, WorkerRole.BOTH: self.both}[role]


@dataclass(frozen=True)
class ModelDecision:
    """What the planner concluded for one model at one step, with the signals behind it."""

    model: str
    condition: Condition
    streak: int
    """Consecutive steps ``condition`` has held (before any reset by this step's move)."""
    pressures: Pressures
    moves: tuple[RoleMove, ...]
    desired: DesiredPools
    current: DesiredPools
    """The active layout before this step's moves (flipping workers count for their new role)."""
    drain: str | None = None
    """The worker to drain before the pool shrinks to ``desired`` (scale-down); None when it does not shrink."""
    held: str | None = None
    """Why a condition that asks for a move produced none (hysteresis, flip in progress, cooldown, minimum pools)."""


@dataclass(frozen=True)
class PlannerStep:
    now: float
    decisions: tuple[ModelDecision, ...] = ()

    @property
    def moves(self) -> tuple[RoleMove, ...]:
        return tuple(m for d in self.decisions for m in d.moves)

    @property
    def desired(self) -> tuple[DesiredPools, ...]:
        return tuple(d.desired for d in self.decisions)

    def decision(self, model: str) -> ModelDecision | None:
        return next((d for d in self.decisions if d.model == model), None)


@dataclass
class _ModelState:
    condition: Condition = Condition.STEADY
    streak: int = 0
    scale_down_streak: int = 0
    drain: str | None = None
    """The worker named to drain, kept while the pool stays underloaded and the worker in it."""
    last_move_at: float | None = None
    """When this model's last move was decided (the latency windows before ``last_move_at + window_s`` still hold
    requests served by the old layout)."""
    last_move_condition: Condition | None = None
    to_both: bool = False
    """The last step's condition was a pressed side's (``decode_bound``, ``transfer_costly``) and asked for moves into
    ``both`` only: its streak is evidence for ``aggregation_pays`` (``low_load``'s is not: no side asked)."""
    first_step_at: float | None = None
    """When the planner first saw the model (its load rates cover a whole window only ``window_s`` later)."""
    split_target: SplitEstimate | None = None
    """The split ``disaggregation_pays`` sized when it started (its moves go on toward it)."""
    mixing_correction: float = 1.0
    """What the aggregated estimate's ITL is multiplied by (``calibration.mixing_correction``)."""
    correction_rose_at: float | None = None
    """When ``mixing_correction`` last rose (a crossing decided before then trusted a refuted estimate)."""
    correction_at: float | None = None
    """When it last changed (it is lowered at most once per ``window_s``: the next window holds new requests)."""

    def moved_for_lately(self, condition: Condition, now: float, settings: PlannerSettings) -> bool:
        """The last move was ``condition``'s, within ``max(window_s, cooldown_s)``: a crossing or a sized split
        goes on for as long as its moves may wait on a cooldown."""
        return (self.last_move_condition is condition and self.last_move_at is not None
                and now - self.last_move_at <= max(settings.window_s, settings.cooldown_s))

    split_at: float | None = None
    """When ``mixing_costly`` last split ``both`` workers (the ITL window before ``split_at + window_s`` holds their
    mixed steps)."""
    queue: QueueHistory = field(default_factory=QueueHistory)
    """The prefill queue's samples since the serving layout last changed (its growth: ``trend.py``)."""
    rates: RateHistory = field(default_factory=RateHistory)
    """The windowed prompt rate step by step (whether the window's load was steady: ``steadiness.py``)."""
    ttft_check: TtftRefutation = field(default_factory=TtftRefutation)
    """The last TTFT-driven crossing to ``both``, checked on its settled layout (``refutation.py``)."""


@dataclass
class _State:
    models: dict[str, _ModelState] = field(default_factory=dict)
    last_move: dict[str, float] = field(default_factory=dict)
    """worker id -> time of its last move (for the cooldown)."""
    moved_for: dict[str, Condition] = field(default_factory=dict)
    """worker id -> the condition of its last move, while its cooldown runs (``splits_back``)."""


def pressures(model: ModelSignals, settings: PlannerSettings, trend: QueueTrend | None = None, *,
              window_covered: bool = True) -> Pressures:
    """The model's prefill and decode pressures (see the module docstring, step 1). Pure; ``trend`` is the prefill
    queue's growth (``QueueHistory.observe``), None when not measured; ``window_covered``: the planner has seen the
    model for a whole ``window_s`` (before that, a prompt rate of zero is a few seconds without an arrival, not an
    idle model)."""
    ttft_ratio = model.ttft.ratio(settings.ttft_ms, settings.min_samples)
    itl_ratio = model.itl.ratio(settings.itl_ms, settings.min_samples)
    transfer_share = model.transfer.ratio(settings.ttft_ms, settings.min_samples)
    prefill_pool = model.prefill_pool
    queue_ratio: float | None = None
    if model.prefill_tokens_per_s and prefill_pool.size:
        wait_s = prefill_pool.queued_prefill_tokens / (model.prefill_tokens_per_s * prefill_pool.size)
        queue_ratio = wait_s * 1000.0 / settings.ttft_ms
    decode_pool = model.decode_pool
    occupancy = decode_pool.batch_occupancy
    kv = decode_pool.kv_usage
    occupancy_ratio = None if occupancy is None else occupancy / settings.occupancy_high
    kv_ratio = None if kv is None else kv / settings.kv_usage_high
    prefill_time_ratio = model.prefill_time.ratio(settings.ttft_ms, settings.min_samples)
    decode_full = any(r is not None and r >= 1.0 for r in (occupancy_ratio, kv_ratio))
    # The prefill side's own evidence: its queue and its prefill-time window. End-to-end TTFT also holds decode-side
    # waits (pulls queued for KV), so it counts only when no prefill-time window is measured and the decode side is
    # not full (a TTFT inflated by a full decode side is decode pressure, not prefill pressure).
    latency_term = prefill_time_ratio if prefill_time_ratio is not None else (None if decode_full else ttft_ratio)
    trend_ratio: float | None = None
    needed: int | None = None
    if trend is not None:
        trend_ratio = trend.projected_wait_s(settings.window_s, prefill_pool.size) * 1000.0 / settings.ttft_ms
        needed = trend.needed(settings.window_s)
    prefill = max((r for r in (latency_term, queue_ratio, trend_ratio) if r is not None), default=0.0)
    decode_terms = [(DecodeDriver.ITL, itl_ratio), (DecodeDriver.OCCUPANCY, occupancy_ratio), (DecodeDriver.KV, kv_ratio)]
    known = [(driver, r) for driver, r in decode_terms if r is not None]
    driver, decode = max(known, key=lambda t: t[1]) if known else (DecodeDriver.NONE, 0.0)
    if decode <= 0.0:
        driver = DecodeDriver.NONE
    # No prefill-side term: unmeasured (not idle) while prompts arrive, in the planner's first window, or while the
    # latency window holds first tokens too few to measure: at a request every ~12 s a 10 s window of the prompt
    # rate often reads zero between two arrivals, and on real CPU workers that "idle" side sent a decode worker to
    # ``both`` a step after an ITL breach had moved it to decode, every cooldown (bench.planner_crossing, 2026-12-06).
    # A prompt over the reach (``window_max_s``) counts as arriving too: right after a layout change the latency
    # windows start empty, and a 10 s lull between two arrivals would otherwise read as an idle side again.
    first_tokens_seen = model.ttft.samples > 0 or model.prefill_time.samples > 0
    arriving = (model.prompt_tokens_per_s or 0.0) > 0.0 or (model.recent_prompt_tokens_per_s or 0.0) > 0.0
    unmeasured = (all(r is None for r in (latency_term, queue_ratio, trend_ratio))
                  and (arriving or not window_covered or first_tokens_seen))
    latency_window = model.prefill_time if prefill_time_ratio is not None else model.ttft
    return Pressures(prefill, decode, driver, ttft_ratio, queue_ratio, itl_ratio, occupancy_ratio, kv_ratio,
                     transfer_share, prefill_time_ratio, trend_ratio, needed, prefill_unmeasured=unmeasured,
                     prefill_window_s=latency_window.span_s if latency_term is not None else None)


def measured_prefill(p: Pressures) -> float | None:
    """The prefill pressure when something measured it (a latency window with ``min_samples``, the queue or its
    trend); None otherwise (its 0.0 is then no evidence)."""
    terms = (p.prefill_time_ratio, p.ttft_ratio, p.queue_ratio, p.trend_ratio)
    return None if p.prefill_unmeasured or all(t is None for t in terms) else p.prefill


def mixing_costly(p: Pressures, settings: PlannerSettings) -> bool:
    """Whether ``both`` workers' mixed steps are what breaks the ITL SLO: the ITL is over it while the decode side's
    capacity terms (batch occupancy, KV usage) are under ``headroom`` (its batches are not what stretches the steps)
    and the prefill side is busy (pressure >= ``aggregate_below``: prompts keep arriving to be mixed in). Only
    meaningful with ``both`` workers serving (``condition_of``)."""
    capacity = max(p.occupancy_ratio or 0.0, p.kv_ratio or 0.0)
    return ((p.itl_ratio or 0.0) > 1.0 and capacity < settings.headroom
            and p.prefill >= settings.aggregate_below)


def without_itl(p: Pressures) -> Pressures:
    """``p`` with its ITL term dropped (unknown): the decode pressure from batch occupancy and KV alone. For an ITL
    window that holds the mixed steps of ``both`` workers split since (``mixing_costly``): it describes a layout that
    no longer serves, and would read as an overload that blocks the prefill moves the split layout needs."""
    terms = [(DecodeDriver.OCCUPANCY, p.occupancy_ratio), (DecodeDriver.KV, p.kv_ratio)]
    known = [(driver, r) for driver, r in terms if r is not None]
    driver, decode = max(known, key=lambda t: t[1]) if known else (DecodeDriver.NONE, 0.0)
    return replace(p, decode=decode, decode_driver=driver if decode > 0.0 else DecodeDriver.NONE, itl_ratio=None)


def load_rates(model: ModelSignals) -> tuple[float, float] | None:
    """The model's prompt and output token rates as the estimates price them; None when either is not measured, or
    when no prompt arrived in the window while prompts wait (queued prefill tokens or waiting requests on a worker):
    a backlog is load that a rate of zero does not describe (closed-loop clients send nothing until answers come,
    and every estimate at zero load holds)."""
    prompts, outputs = model.prompt_tokens_per_s, model.output_tokens_per_s
    if prompts is None or outputs is None:
        return None
    if prompts <= 0.0 and any(w.queued_prefill_tokens > 0 or w.waiting_requests > 0 for w in model.active):
        return None
    return prompts, outputs


def estimate_aggregated(model: ModelSignals, workers: int, settings: PlannerSettings) -> MixedEstimate | None:
    """Every one of ``workers`` as ``both`` at the model's measured load (``mixing.py``); None without an engine
    profile or without the load rates (``load_rates``)."""
    profile = settings.engine_profile
    rates = load_rates(model)
    if profile is None or rates is None or workers < 1:
        return None
    return aggregated_estimate(profile, workers, *rates)


def with_estimate(p: Pressures, estimate: MixedEstimate | None, settings: PlannerSettings,
                  correction: float = 1.0) -> Pressures:
    """``p`` with the aggregated estimate's terms (for the decision's log line and metrics)."""
    if settings.engine_profile is not None:
        p = replace(p, mixing_correction=correction)
    if estimate is None:
        return p
    itl = math.inf if estimate.itl_ms is None else estimate.itl_ms / settings.itl_ms
    return replace(p, aggregated_itl_ratio=itl, aggregated_busy=estimate.prefill_busy)


def all_both_settled(model: ModelSignals, layout: DesiredPools, state: _ModelState, now: float,
                     settings: PlannerSettings) -> bool:
    """Every active worker of the model is ``both``, none is flipping, and the latency window holds only this
    layout's requests (a whole ``window_s`` since the model was first seen and since its last move): the one layout
    whose ITL the aggregated estimate predicts (``calibration.py``)."""
    if layout.total == 0 or layout.both != layout.total or model.flipping:
        return False
    since = state.last_move_at if state.last_move_at is not None else state.first_step_at
    return since is not None and now - since >= settings.window_s


def estimate_split(model: ModelSignals, workers: int, settings: PlannerSettings) -> SplitEstimate | None:
    """The split of ``workers`` the engine profile sizes for the model's measured load (``mixing.sized_split``), with
    the ITL under ``headroom`` of its SLO and the prefill workers busy at most ``aggregate_busy_max``; where no split
    has both margins, the one that holds the SLO itself (ITL under it, prefill workers busy under all of their time):
    near the best split's capacity the margins come and go with the window's rates, and each step without a sized
    split restarted its hysteresis while the ``both`` workers kept missing the ITL (the burst guard, not this
    margin, is what keeps a burst from being split: ``disaggregation_pays``). None without a profile, without the
    load rates (``load_rates``), or when no split holds the SLO.

    At least two decode workers (``sized_split``'s guard for the decode side's KV, which the profile does not price)
    where the model has three workers or more; with two, one prefill and one decode worker is the only split there
    is, and a guard that ruled it out left two ``both`` workers missing the ITL SLO with no way to split."""
    profile = settings.engine_profile
    rates = load_rates(model)
    if profile is None or rates is None or workers < 2:
        return None
    min_decode = 1 if workers == 2 else 2
    with_margin = sized_split(profile, workers, *rates, itl_target_ms=settings.itl_ms, itl_margin=settings.headroom,
                              busy_max=settings.aggregate_busy_max, min_decode=min_decode)
    if with_margin is not None:
        return with_margin
    return sized_split(profile, workers, *rates, itl_target_ms=settings.itl_ms, itl_margin=1.0, busy_max=1.0,
                       min_decode=min_decode)


def resized(target: SplitEstimate, model: ModelSignals, settings: PlannerSettings) -> SplitEstimate | None:
    """``target``'s split at the model's load now, if it still holds it within the SLO itself (no ``headroom``, all
    of the prefill workers' time): the band a started split goes on in; None otherwise."""
    profile = settings.engine_profile
    rates = load_rates(model)
    if profile is None or rates is None:
        return None
    now = split_estimate(profile, target.prefill, target.decode, *rates)
    return now if now.holds(settings.itl_ms, 1.0, 1.0) else None


def with_split(p: Pressures, split: SplitEstimate | None, settings: PlannerSettings) -> Pressures:
    """``p`` with the sized split's terms (for the decision's log line and metrics)."""
    if split is None or split.itl_ms is None:
        return p
    return replace(p, split_prefill=split.prefill, split_itl_ratio=split.itl_ms / settings.itl_ms)


def split_moves_needed(layout: DesiredPools, split: SplitEstimate) -> tuple[int, int]:
    """``both`` workers the split still needs as (decode, prefill) workers; only ``both`` workers move."""
    decode = max(0, split.decode - layout.decode)
    prefill = max(0, split.prefill - layout.prefill)
    both = layout.both
    decode = min(decode, both)
    return decode, min(prefill, both - decode)


def moves_back(layout: DesiredPools, prefill: int, decode: int) -> tuple[int, int]:
    """``both`` workers the split (``prefill``, ``decode``) still needs as (decode, prefill) workers."""
    to_decode = min(max(0, decode - layout.decode), layout.both)
    return to_decode, min(max(0, prefill - layout.prefill), layout.both - to_decode)


def band_middle(settings: PlannerSettings) -> float:
    """The middle of the band between ``headroom`` (``aggregation_pays`` crosses to ``both`` under it) and 1.0 (a
    crossing goes on up to it), as a share of the ITL SLO: ``disaggregation_pays`` splits only above it."""
    return (settings.headroom + 1.0) / 2.0


def burst_spread(aggregated: MixedEstimate | None, settings: PlannerSettings) -> bool:
    """The estimate for every worker as ``both`` holds the window's load in the lower half of the crossing's band
    (``band_middle`` of the ITL SLO, prompts within ``aggregate_busy_max``): an ITL breach then is a burst's spread,
    not a load that a split or a decode worker more would serve better."""
    return aggregated is not None and aggregated.holds(settings.itl_ms, band_middle(settings),
                                                       settings.aggregate_busy_max)


def held_for_estimates(condition: Condition, p: Pressures, aggregated: MixedEstimate | None, layout: DesiredPools,
                       state: _ModelState, now: float, settings: PlannerSettings) -> str | None:
    """Why an ITL breach of ``both`` workers (``decode_bound`` driven by the ITL, ``mixing_costly``) makes no rule's
    move when the planner has an engine profile; None: the rules act.

    - The first ``window_s``: ``disaggregation_pays`` sizes the split for that breach once the load rates cover a
      whole window (``aggregation_pays`` needs the same rates), and a rule's move before then (one ``both`` worker to
      decode) only restarted the settling window that the sized split then waited out (in the evaluation from
      all-``both``: prompt-heavy 0.91-0.94x the best split, 0.98x held).
    - Every worker ``both`` while the estimate says they hold the window's load in the lower half of the crossing's
      band (the burst guard of ``disaggregation_pays``): the breach is a burst's spread, and a ``both`` worker moved
      to decode for it came back at the next quiet period (``decode_bound``'s move into ``both``), a flip-flop
      every cooldown.

    Without a profile, where the decode side is full (KV, batch slots: the profile does not price them), or for the
    queue's trend (``prefill_bound``), the rules act as before."""
    itl_breach = condition is Condition.MIXING_COSTLY or (
        condition is Condition.DECODE_BOUND and p.decode_driver is DecodeDriver.ITL)
    if not (itl_breach and settings.engine_profile is not None and layout.both > 0):
        return None
    if state.first_step_at is not None and now - state.first_step_at < settings.window_s:
        return (f"the engine profile's estimates decide this: their load rates cover "
                f"{now - state.first_step_at:.1f} of {settings.window_s:g} s")
    all_both = layout.prefill == 0 and layout.decode == 0
    if condition is Condition.DECODE_BOUND and all_both and burst_spread(aggregated, settings):
        return (f"a burst's spread: every worker as both holds this load at {p.aggregated_itl_ratio:.2f} of the ITL "
                f"SLO (estimate)")
    return None


def disaggregation_pays(p: Pressures, split: SplitEstimate | None, layout: DesiredPools,
                        settings: PlannerSettings, *, splitting: bool = False,
                        aggregated: MixedEstimate | None = None) -> bool:
    """Whether ``both`` workers should go straight to the split the engine profile sizes: they serve, their ITL is
    over its SLO while prompts keep arriving and the decode side's capacity terms are under ``headroom`` (the
    evidence of ``mixing_costly``, in any layout with ``both`` workers, all-``both`` included), the profile sizes a
    split of the model's workers that holds the load (``estimate_split``), and that split still needs some of the
    ``both`` workers. ``splitting``: the last move was this split's, which goes on while the sized split holds
    (``split`` is then sized within the SLO itself, not ``headroom``: a band, as for ``aggregation_pays``) and
    still needs ``both`` workers, whatever the stale latency windows say."""
    if split is None or layout.both == 0 or sum(split_moves_needed(layout, split)) == 0:
        return False
    if splitting:
        return True
    if burst_spread(aggregated, settings):
        # the estimate says every worker as ``both`` holds this load in the lower half of the crossing's band (under
        # ``headroom`` ``aggregation_pays`` crosses, up to 1.0 a crossing goes on): an ITL over its SLO then is the
        # load's spread (a burst), and a split sized to the window's mean load would leave the next burst nothing
        return False
    return mixing_costly(p, settings)


def aggregation_pays(p: Pressures, estimate: MixedEstimate | None, settings: PlannerSettings, *,
                     disaggregated: bool, crossing: bool = False) -> bool:
    """Whether a split should cross to aggregated serving: some worker is not ``both``, the estimate for every
    worker as ``both`` at this load holds the ITL under ``headroom`` of its SLO and keeps up with the prompts
    (``aggregate_busy_max``), and a side of the split misses its SLO (pressure over 1): the split fails a load
    that aggregated serving would hold. ``crossing``: the last move was this crossing's, which goes on while the
    estimate keeps up with the prompts and holds the ITL SLO itself (a band, as ``aggregate_below`` is one in
    pressure: a crossing started with margin is not left half done on a noisy load estimate; the half-crossed
    layout's pressures describe neither family)."""
    if not (settings.allow_aggregated and disaggregated and estimate is not None):
        return False
    if crossing:
        return estimate.holds(settings.itl_ms, 1.0, 1.0)
    if not estimate.holds(settings.itl_ms, settings.headroom, settings.aggregate_busy_max):
        return False
    return p.prefill > 1.0 or p.decode > 1.0


def condition_of(p: Pressures, settings: PlannerSettings, *, disaggregated: bool,
                 aggregated_workers: bool = False) -> Condition:
    """The first condition that holds (module docstring, step 2). ``disaggregated``: some worker is not ``both``;
    ``aggregated_workers``: some worker is ``both``."""
    if aggregated_workers and disaggregated and mixing_costly(p, settings):
        return Condition.MIXING_COSTLY
    if p.prefill > 1.0 and p.decode > 1.0:
        return Condition.OVERLOADED
    if p.prefill > 1.0:
        return Condition.PREFILL_BOUND if p.decode < settings.headroom else Condition.OVERLOADED
    if p.decode > 1.0:
        return Condition.DECODE_BOUND if p.prefill < settings.headroom else Condition.OVERLOADED
    if (settings.allow_aggregated and disaggregated and p.prefill_idle(settings)
            and p.decode >= settings.headroom):
        # prefill nearly idle while decode nears its SLO: the idle prefill workers join the decode side (as
        # ``both``) before decode misses it; the latency windows lag a shift by up to ``window_s``
        return Condition.DECODE_BOUND
    if settings.allow_aggregated and disaggregated:
        if p.prefill_idle(settings) and p.decode < settings.aggregate_below:
            return Condition.LOW_LOAD
        if (p.transfer_share is not None and p.transfer_share > settings.transfer_share_max
                and p.prefill < settings.headroom and p.decode < settings.headroom):
            return Condition.TRANSFER_COSTLY
    return Condition.STEADY


def _layout(model: str, workers: Iterable[WorkerSignals]) -> DesiredPools:
    roles = [w.effective_role for w in workers]
    return DesiredPools(model, roles.count(WorkerRole.PREFILL), roles.count(WorkerRole.DECODE),
                        roles.count(WorkerRole.BOTH))


def _keeps_minimums(layout: DesiredPools, settings: PlannerSettings) -> bool:
    return (layout.prefill + layout.both >= settings.min_prefill_workers
            and layout.decode + layout.both >= settings.min_decode_workers
            and layout.total >= 1)


def _moved(layout: DesiredPools, src: WorkerRole, dst: WorkerRole) -> DesiredPools:
    counts = {r: layout.of(r) for r in WorkerRole}
    counts[src] -= 1
    counts[dst] += 1
    return DesiredPools(layout.model, counts[WorkerRole.PREFILL], counts[WorkerRole.DECODE], counts[WorkerRole.BOTH])


def _least_busy(workers: Iterable[WorkerSignals]) -> list[WorkerSignals]:
    return sorted(workers, key=lambda w: (w.running_requests, w.waiting_requests, w.queued_prefill_tokens,
                                          w.worker_id))


def queue_keeps_up(p: Pressures, settings: PlannerSettings) -> bool:
    """Whether the prefill pool keeps up now although its latency window is over the SLO: its queue wait is known
    and short (under ``aggregate_below`` of the SLO) and not growing past it (the trend). More prefill workers only
    shorten the queue, so the window then holds a past backlog (a burst that is over), not a missing worker."""
    return (p.queue_ratio is not None and p.queue_ratio < settings.aggregate_below
            and (p.trend_ratio is None or p.trend_ratio <= 1.0))


def decode_misses(p: Pressures, settings: PlannerSettings) -> bool:
    """Whether a full decode side (KV or occupancy) shows in the latencies: ITL near its SLO (``headroom``), or the
    end-to-end TTFT over it (pulls waiting for KV blocks)."""
    return (p.itl_ratio or 0.0) >= settings.headroom or (p.ttft_ratio or 0.0) > 1.0


def _routes(condition: Condition, p: Pressures, settings: PlannerSettings, *,
            decode_workers: bool = True) -> list[tuple[WorkerRole, WorkerRole]]:
    """(from, to) role pairs to try, in order, for a condition that asks for a move (``mixing_costly``:
    ``split_routes``). ``decode_workers``: the layout has ``decode`` workers (a prefill worker's prompts go to them;
    ``both`` workers serve their own)."""
    if condition is Condition.PREFILL_BOUND:
        if queue_keeps_up(p, settings):
            return []
        if not decode_workers:
            # every worker is ``both`` or prefill and already prefills, and the decode side has headroom (its ITL
            # within the SLO: the mixed steps are not what limits): a ``both`` worker moved to prefill adds no
            # prefill capacity, takes its decode capacity away, and where ``both`` workers prefill their own prompts
            # gets none (no decode worker pulls from it). No role change helps; the desired sizes ask for a worker.
            return []
        return [(WorkerRole.BOTH, WorkerRole.PREFILL), (WorkerRole.DECODE, WorkerRole.PREFILL)]
    if condition is Condition.DECODE_BOUND:
        if settings.allow_aggregated and p.prefill_idle(settings):
            # prefill is nearly idle: its workers join the decode side and still prefill (short prompts ride on
            # decode steps almost for free), then decode workers prefill locally too (no transfer)
            return [(WorkerRole.PREFILL, WorkerRole.BOTH), (WorkerRole.DECODE, WorkerRole.BOTH)]
        if p.decode_driver in (DecodeDriver.KV, DecodeDriver.OCCUPANCY):
            if p.prefill >= settings.aggregate_below and not decode_misses(p, settings):
                # full but within both SLOs, and the prefill side is busy: taking a prefill worker would starve it
                # (and a ``both`` worker mixing long prompts into its decode steps stretches its ITL)
                return []
            if settings.allow_aggregated:
                return [(WorkerRole.PREFILL, WorkerRole.BOTH)]
        return [(WorkerRole.PREFILL, WorkerRole.DECODE), (WorkerRole.BOTH, WorkerRole.DECODE)]
    if condition in (Condition.LOW_LOAD, Condition.TRANSFER_COSTLY, Condition.AGGREGATION_PAYS):
        return [(WorkerRole.PREFILL, WorkerRole.BOTH), (WorkerRole.DECODE, WorkerRole.BOTH)]
    if condition in (Condition.DISAGGREGATION_PAYS, Condition.AGGREGATION_REFUTED):
        # decode workers first: a prefill worker beside only ``both`` workers gets no prompts (they serve theirs)
        return [(WorkerRole.BOTH, WorkerRole.DECODE), (WorkerRole.BOTH, WorkerRole.PREFILL)]
    return []


def split_routes(p: Pressures, model: ModelSignals, settings: PlannerSettings) -> list[tuple[WorkerRole, WorkerRole]]:
    """Where ``mixing_costly`` sends the ``both`` workers: to prefill (full-rate prefill, no more mixed steps) while
    the decode side's capacity terms, on the decode pool one worker smaller, stay under ``headroom``; otherwise to
    decode (the decode side needs the worker's batch slots and KV, the prefill side keeps the prefill workers)."""
    capacity = max(p.occupancy_ratio or 0.0, p.kv_ratio or 0.0)
    size = model.decode_pool.size
    if model.with_role(WorkerRole.DECODE) and size > 1 and capacity * size / (size - 1) < settings.headroom:
        return [(WorkerRole.BOTH, WorkerRole.PREFILL)]
    return [(WorkerRole.BOTH, WorkerRole.DECODE)]


_UNNEEDED = (Condition.LOW_LOAD, Condition.TRANSFER_COSTLY)
"""Conditions whose moves to ``both`` no side needed: both sides had headroom, the move only stopped paying for a
disaggregation that did not pay."""


def splits_back(src: WorkerRole, condition: Condition, moved_for: Condition | None = None, *,
                refuted: bool = False) -> bool:
    """Whether a move out of ``both`` for ``condition`` may skip the cooldown. ``moved_for``: the condition of the
    worker's own move into ``both`` while its cooldown runs (None: not known, or the cooldown is over). ``refuted``:
    that move was ``aggregation_pays``'s and the mixing correction rose after it (``calibration.py``: the estimate
    the crossing trusted was shown wrong on the layout it made), so the cooldown would only keep a layout known to
    break the ITL.

    ``prefill_bound`` (prefill over its SLO): always. ``mixing_costly`` (the ITL over its SLO from mixed steps):
    only when no side needed the move into ``both`` (``low_load``, ``transfer_costly``, or not known): that move
    was taken with both sides under ``headroom`` (``low_load``: under ``aggregate_below``), and it is split back on
    a side over its SLO, so that band is the hysteresis and the cooldown would only keep a layout the signals
    already refute (a ramp whose light first seconds sent prefill workers to ``both``). A move into ``both`` for ``decode_bound`` relieved a decode side
    near its SLO; splitting it back on the ITL trades that side's capacity back for fewer mixed steps, a reversal on
    the same side's evidence, so it keeps its cooldown (on bursts every burst's ITL split the quiet period's moves
    back, once per burst period). The move back into ``both`` always keeps its cooldown."""
    if src is not WorkerRole.BOTH:
        return False
    if condition in (Condition.PREFILL_BOUND, Condition.AGGREGATION_REFUTED):
        return True
    return (condition in (Condition.MIXING_COSTLY, Condition.DISAGGREGATION_PAYS)
            and (moved_for is None or moved_for in _UNNEEDED
                 or (refuted and moved_for is Condition.AGGREGATION_PAYS)))


def wanted_moves(condition: Condition, p: Pressures, model: ModelSignals, settings: PlannerSettings) -> int:
    """How many workers to move this step (module docstring, step 4). ``prefill_bound`` with a measured queue
    trend: the shortfall, ``prefill_needed - pool size`` (the decode side may then fill up to 1.0, not just
    ``headroom``: that is the layout the demand needs; its capacity terms are scaled both by its smaller pool and by
    the larger prefill pool's output, which it then receives: a growing queue means the pool computes at full rate). Otherwise in proportion to how far the pressed side is
    over its SLO, ``ceil(pool size x (pressure - 1) / 4)`` (a latency ratio overstates the capacity missing; the next
    step's fresh evidence asks for the rest; fewer when the decode side would lose its headroom), at least 1, at most ``max_moves_per_step``. When the moves go to ``both`` because
    prefill is nearly idle (``low_load``, ``decode_bound`` under ``aggregate_below``), ``max_moves_per_step``: those
    workers' prefill capacity is wasted, and a ``both`` worker still prefills; the same for ``aggregation_pays``
    (a half-crossed layout is neither family). ``mixing_costly``: every ``both``
    worker (each one mixes), fewer when the decode side would lose its headroom. ``transfer_costly`` moves one."""
    cap = settings.max_moves_per_step
    if condition in (Condition.AGGREGATION_PAYS, Condition.DISAGGREGATION_PAYS, Condition.AGGREGATION_REFUTED,
                     Condition.LOW_LOAD) or (
            condition is Condition.DECODE_BOUND and settings.allow_aggregated and p.prefill_idle(settings)):
        return cap
    if condition is Condition.PREFILL_BOUND:
        pressure, size = p.prefill, model.prefill_pool.size
        # the decode side gives workers away only while its capacity terms (which scale with its size) stay
        # under ``headroom`` with fewer workers
        source, source_size = max(p.occupancy_ratio or 0.0, p.kv_ratio or 0.0), model.decode_pool.size
    elif condition is Condition.DECODE_BOUND:
        pressure, size = p.decode, model.decode_pool.size
        source, source_size = 0.0, model.prefill_pool.size
    elif condition is Condition.MIXING_COSTLY:
        # every ``both`` worker mixes; moves to prefill take the decode side's capacity with them, so they stop
        # before its capacity terms would reach ``headroom``
        pressure, size = p.itl_ratio or 0.0, len(model.with_role(WorkerRole.BOTH))
        source, source_size = max(p.occupancy_ratio or 0.0, p.kv_ratio or 0.0), model.decode_pool.size
    else:
        return 1
    if condition is Condition.MIXING_COSTLY:
        wanted = max(1, min(cap, size))
    elif condition is Condition.PREFILL_BOUND and p.prefill_needed is not None:
        # the measured demand says how many workers the pool is short (trend.py); a latency ratio does not
        wanted = max(1, min(cap, p.prefill_needed - size))
    else:
        wanted = max(1, min(cap, math.ceil(max(1, size) * (pressure - 1.0) / 4.0)))
    # a move sized from the measured demand may fill the decode side up to full (1.0): the layout the demand needs
    sized = condition is Condition.PREFILL_BOUND and p.prefill_needed is not None
    limit = 1.0 if sized else settings.headroom

    def after(k: int) -> float:
        # the decode side's capacity terms once k of its workers are gone; for a move sized from a growing queue
        # also once the larger prefill pool's output reaches it (a growing queue means the pool computes at its
        # full rate, so its output, the decode side's inflow, grows with it)
        inflow = (size + k) / size if sized and size > 0 else 1.0
        return source * source_size / (source_size - k) * inflow

    while wanted > 1 and source_size - wanted > 0 and after(wanted) >= limit:
        wanted -= 1
    return wanted


_QUEUE_SETTLES = (Condition.PREFILL_BOUND, Condition.MIXING_COSTLY, Condition.LOW_LOAD)
"""Last-move conditions after which a queue-driven ``prefill_bound`` needs no settling window: moves toward prefill
(``prefill_bound``; ``mixing_costly``'s splits) and the ``low_load`` moves to ``both`` that a rising queue refutes.
The queue's samples postdate those moves' flips (``trend.py``), so they are fresh evidence of the layout serving."""


class Planner:
    """The decision core. One instance per planner loop (it keeps the streaks and cooldowns); not thread-safe."""

    def __init__(self, settings: PlannerSettings) -> None:
        self._settings = settings
        self._state = _State()

    @property
    def settings(self) -> PlannerSettings:
        return self._settings

    def step(self, signals: ClusterSignals, now: float) -> PlannerStep:
        """Decide for every model in ``signals``. ``now`` is any monotonic clock in seconds (simulated or real)."""
        cooldown = self._settings.cooldown_s
        self._state.last_move = {w: t for w, t in self._state.last_move.items() if now - t < cooldown}
        self._state.moved_for = {w: c for w, c in self._state.moved_for.items() if w in self._state.last_move}
        seen = {m.model for m in signals.models}
        self._state.models = {k: v for k, v in self._state.models.items() if k in seen}
        return PlannerStep(now, tuple(self._decide(model, now) for model in signals.models))

    def _decide(self, model: ModelSignals, now: float) -> ModelDecision:
        s = self._settings
        state = self._state.models.setdefault(model.model, _ModelState())
        trend = state.queue.observe(model, now, s.window_s)
        state.rates.observe(now, model.prompt_tokens_per_s, s.window_s)
        if state.first_step_at is None:
            state.first_step_at = now
            if s.engine_profile is not None:
                # the operator's check of the profile (``profile --check-load``) is where the correction starts
                state.mixing_correction = s.engine_profile.mixing_correction
        p = pressures(model, s, trend, window_covered=now - state.first_step_at >= s.window_s)
        active = model.active
        current = _layout(model.model, active)
        if state.split_at is not None and now - state.split_at < s.window_s and current.both == 0:
            p = without_itl(p)
        disaggregated = current.prefill + current.decode > 0
        estimate = estimate_aggregated(model, current.total, s)
        swing = state.rates.swing(now, s.window_s)
        p = replace(p, load_swing=swing)
        settled_both = all_both_settled(model, current, state, now, s)
        if settled_both:
            # the first tokens' check of a crossing decided on the prefill side (``refutation.py``)
            state.ttft_check.settled(measured_prefill(p), model.prompt_tokens_per_s, s.steady_swing_max, now=now,
                                     window_s=s.window_s)
        state.ttft_check.lighter(model.prompt_tokens_per_s, s.steady_swing_max,
                                 measured=model.ttft.samples >= s.min_samples)
        refuted = state.ttft_check.blocks
        p = replace(p, aggregation_refuted=refuted)
        if estimate is not None and settled_both:
            ratio = model.itl.ratio(s.itl_ms, s.min_samples)
            may_lower = state.correction_at is None or now - state.correction_at >= s.window_s
            # a window of bursts may lower the correction, never raise it (``steadiness.py``); None: too few readings
            steady = swing is None or swing <= s.steady_swing_max
            correction = mixing_correction(state.mixing_correction, None if ratio is None else ratio * s.itl_ms,
                                           estimate.itl_ms, s.headroom, may_lower=may_lower, may_raise=steady)
            if correction > state.mixing_correction:
                state.correction_rose_at = now
            if correction != state.mixing_correction:
                state.correction_at = now
            state.mixing_correction = correction
        estimate = None if estimate is None else estimate.dearer(state.mixing_correction)
        p = with_estimate(p, estimate, s, state.mixing_correction)
        # a crossing goes on while its estimate holds, for as long as its moves may wait on a cooldown
        crossing = state.moved_for_lately(Condition.AGGREGATION_PAYS, now, s)
        # a split sized by the profile goes on the same way (within the SLO itself, not ``headroom``: a band)
        splitting = state.moved_for_lately(Condition.DISAGGREGATION_PAYS, now, s)
        if splitting and state.split_target is not None:
            # the split sized when it started, while it still holds the load within the SLO itself
            split = resized(state.split_target, model, s)
        elif now - state.first_step_at >= s.window_s:
            # the load rates size the split: not before they cover a whole window (the output rate lags the prompts')
            split = estimate_split(model, current.total, s)
        else:
            split = None
        p = with_split(p, split, s)
        quota: dict[WorkerRole, int] | None = None
        back = state.ttft_check.way_back(current.total, current.both)
        if back is not None:
            # a crossing its first tokens refuted goes back to its split at once (``refutation.py``)
            condition = Condition.AGGREGATION_REFUTED
            crossing = True
            to_decode, to_prefill = moves_back(current, *back)
            quota = {WorkerRole.DECODE: to_decode, WorkerRole.PREFILL: to_prefill}
        elif not refuted and aggregation_pays(p, estimate, s, disaggregated=disaggregated, crossing=crossing):
            condition = Condition.AGGREGATION_PAYS
        elif disaggregation_pays(p, split, current, s, splitting=splitting, aggregated=estimate):
            assert split is not None
            condition = Condition.DISAGGREGATION_PAYS
            crossing = splitting
            to_decode, to_prefill = split_moves_needed(current, split)
            quota = {WorkerRole.DECODE: to_decode, WorkerRole.PREFILL: to_prefill}
        else:
            condition = condition_of(p, s, disaggregated=disaggregated, aggregated_workers=current.both > 0)
            crossing = False
        # a condition that asked for moves into ``both`` is evidence for the crossing into ``both`` too: its streak
        # carries over (on a shift to generation-heavy, idle prefill workers' ``decode_bound`` turns into the crossing)
        same = condition is state.condition or (condition is Condition.AGGREGATION_PAYS and state.to_both)
        state.streak = state.streak + 1 if same else 1
        state.condition = condition
        streak = state.streak

        moves: list[RoleMove] = []
        held: str | None = None
        no_candidate = False
        layout = current
        decode_workers = bool(model.with_role(WorkerRole.DECODE))
        routes = (split_routes(p, model, s) if condition is Condition.MIXING_COSTLY
                  else _routes(condition, p, s, decode_workers=decode_workers))
        if condition is Condition.DECODE_BOUND and not routes:
            held = "decode full, latencies within their SLOs: prefill is busy, nothing to move"
        elif condition is Condition.PREFILL_BOUND and not routes and queue_keeps_up(p, s):
            held = "prefill queue short and not growing: the latency window holds a past backlog"
        elif condition is Condition.PREFILL_BOUND and not routes:
            held = "no decode worker: every worker prefills already, a role change adds no prefill; a worker more"
            no_candidate = True
        # a prefill queue that rose at each of the last ``hysteresis_steps`` samples, all taken on the layout serving
        # now, is that many steps of fresh evidence by itself: it needs neither a streak of the condition nor a
        # latency window that postdates the last move (when that move was toward prefill too)
        queue_driven = (condition is Condition.PREFILL_BOUND and trend is not None and p.trend_ratio is not None
                        and p.trend_ratio > 1.0 and trend.rising_steps >= s.hysteresis_steps)
        if routes:
            if streak < s.hysteresis_steps and not queue_driven and not crossing:
                held = f"hysteresis {streak}/{s.hysteresis_steps}"
            elif model.flipping:
                held = "flip in progress: " + ",".join(sorted(w.worker_id for w in model.flipping))
            elif (waiting := held_for_estimates(condition, p, estimate, current, state, now, s)) is not None:
                held = waiting
            elif (state.last_move_at is not None and now - state.last_move_at < s.window_s and not crossing
                  and not (queue_driven and state.last_move_condition in _QUEUE_SETTLES)):
                held = f"settling: the latency window predates the last move ({now - state.last_move_at:.1f} s ago)"
            else:
                limit = wanted_moves(condition, p, model, s)
                moves, layout, held, no_candidate = self._pick_moves(model, condition, routes, layout, now, limit,
                                                                     quota, state.correction_rose_at)
                if moves:
                    if condition is Condition.AGGREGATION_PAYS and not crossing:
                        state.ttft_check.crossed(measured_prefill(p), model.prompt_tokens_per_s,
                                                 (current.prefill, current.decode))
                    elif condition is not Condition.AGGREGATION_PAYS:
                        state.ttft_check.moved()
                    state.streak = 0
                    state.last_move_at = now
                    state.last_move_condition = condition
                    if condition in (Condition.MIXING_COSTLY, Condition.DISAGGREGATION_PAYS):
                        state.split_at = now
                    state.split_target = split if condition is Condition.DISAGGREGATION_PAYS else None
        state.to_both = (condition in (Condition.DECODE_BOUND, Condition.TRANSFER_COSTLY) and bool(routes)
                         and all(dst is WorkerRole.BOTH for _, dst in routes))
        moved = {m.worker_id for m in moves}
        desired, drain = self._desired(model, p, condition, layout, no_candidate, state, moved)
        return ModelDecision(model.model, condition, streak, p, tuple(moves), desired, current, drain, held)

    def _pick_moves(self, model: ModelSignals, condition: Condition, routes: list[tuple[WorkerRole, WorkerRole]],
                    layout: DesiredPools, now: float, limit: int,
                    quota: dict[WorkerRole, int] | None = None, corrected_at: float | None = None,
                    ) -> tuple[list[RoleMove], DesiredPools, str | None, bool]:
        """Up to ``limit`` moves along ``routes`` in order; ``quota``: at most that many into each role named;
        ``corrected_at``: when the model's mixing correction last rose (``splits_back``)."""
        s = self._settings
        moves: list[RoleMove] = []
        blocked: set[str] = set()
        any_candidate = False
        for src, dst in routes:
            for worker in _least_busy(model.with_role(src)):
                if len(moves) >= limit:
                    break
                if quota is not None and sum(m.to_role is dst for m in moves) >= quota.get(dst, 0):
                    break
                if any(m.worker_id == worker.worker_id for m in moves):
                    continue
                if not worker.can_serve(dst):
                    blocked.add("launch cannot serve " + dst.value)
                    continue
                after = _moved(layout, src, dst)
                if not _keeps_minimums(after, s):
                    blocked.add("minimum pools")
                    continue
                any_candidate = True
                last = self._state.last_move.get(worker.worker_id)
                moved_for = self._state.moved_for.get(worker.worker_id)
                refuted = corrected_at is not None and last is not None and corrected_at > last
                if (last is not None and now - last < s.cooldown_s
                        and not splits_back(src, condition, moved_for, refuted=refuted)):
                    blocked.add("cooldown")
                    continue
                moves.append(RoleMove(worker.worker_id, model.model, src, dst, condition))
                self._state.last_move[worker.worker_id] = now
                self._state.moved_for[worker.worker_id] = condition
                layout = after
        held = None if moves else ("no movable worker: " + ",".join(sorted(blocked)) if blocked
                                   else "no movable worker")
        return moves, layout, held, not any_candidate

    def _desired(self, model: ModelSignals, p: Pressures, condition: Condition, layout: DesiredPools,
                 no_candidate: bool, state: _ModelState, moved: set[str]) -> tuple[DesiredPools, str | None]:
        s = self._settings
        aggregated = layout.prefill + layout.decode == 0
        grow: WorkerRole | None = None
        if condition is Condition.OVERLOADED or (no_candidate and condition in (Condition.PREFILL_BOUND,
                                                                                Condition.DECODE_BOUND)):
            side = WorkerRole.PREFILL if p.prefill >= p.decode else WorkerRole.DECODE
            grow = WorkerRole.BOTH if aggregated else side
        if grow is not None:
            state.scale_down_streak, state.drain = 0, None
            counts = {r: layout.of(r) for r in WorkerRole}
            counts[grow] += 1
            return DesiredPools(model.model, counts[WorkerRole.PREFILL], counts[WorkerRole.DECODE],
                                counts[WorkerRole.BOTH]), None
        if p.prefill < s.scale_down_below and p.decode < s.scale_down_below:
            state.scale_down_streak += 1
        else:
            state.scale_down_streak, state.drain = 0, None
        if state.scale_down_streak < s.hysteresis_steps or model.flipping:
            return layout, None
        if state.drain is not None:  # the same worker, until it leaves the pool (draining, gone)
            named = next((w for w in model.active if w.worker_id == state.drain and not w.flipping
                          and w.worker_id not in moved), None)
            if named is not None:
                counts = {r: layout.of(r) for r in WorkerRole}
                counts[named.effective_role] -= 1
                smaller = DesiredPools(model.model, counts[WorkerRole.PREFILL], counts[WorkerRole.DECODE],
                                       counts[WorkerRole.BOTH])
                if _keeps_minimums(smaller, s):
                    return smaller, named.worker_id
            state.scale_down_streak, state.drain = 0, None  # it left: the next removal needs fresh evidence
            return layout, None
        order = sorted((WorkerRole.PREFILL, WorkerRole.DECODE),
                       key=lambda r: p.prefill if r is WorkerRole.PREFILL else p.decode)
        for role in (*order, WorkerRole.BOTH):
            if layout.of(role) == 0:
                continue
            counts = {r: layout.of(r) for r in WorkerRole}
            counts[role] -= 1
            smaller = DesiredPools(model.model, counts[WorkerRole.PREFILL], counts[WorkerRole.DECODE],
                                   counts[WorkerRole.BOTH])
            if not _keeps_minimums(smaller, s):
                continue
            victims = [w for w in _least_busy(model.with_role(role)) if not w.flipping and w.worker_id not in moved]
            if not victims:
                continue
            state.drain = victims[0].worker_id
            return smaller, state.drain
        return layout, None
