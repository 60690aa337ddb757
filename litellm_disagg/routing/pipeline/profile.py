"""Profiles: how one pool's worker is chosen (scorer weights, the cost's terms, the picker's temperature and
tie-break), as llm-d's scheduling profiles. Weights live here, not in scorers, so one scorer can weigh differently
for the prefill and the decode pool.

Presets:

| profile            | weights                                        | tie-break      | used                               |
|--------------------|------------------------------------------------|----------------|------------------------------------|
| ``least_inflight`` | ``load: 1`` (the router's own in-flight counts) | rotate         | ``picker: least_inflight`` (default) |
| ``round_robin``    | none (every candidate ties)                     | rotate         | ``picker: round_robin``              |
| KV prefill         | ``kv_cost: 1`` (uncached + queued blocks)       | least loaded   | ``kv_routing.prefill``               |
| KV decode          | ``kv_cost: 1, kv_free: 0.25, prefix_overlap: 0.5, | least loaded | ``kv_routing.decode``              |
|                    | live_sessions: 1``; bounded load 1.5x mean + 2   |              |                                    |

``bounded_load`` (``bounded_load.py``) keeps a hot prefix's holder from being chosen while its load is above the
bound; ``sessions`` sets what the ``live_sessions`` scorer counts (``routing/kv/live_sessions.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NonNegative = Annotated[float, Field(ge=0)]

TieBreak = Literal["least_loaded", "rotate"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CostWeights(_Strict):
    """``kv_cost``'s terms: ``prefill * (uncached + queued prefill blocks) + decode * used blocks + active * active
    requests``."""

    prefill: NonNegative = 1.0
    decode: NonNegative = 1.0
    active: NonNegative = 1.0


class BoundedLoadSettings(_Strict):
    """Bounded load (``bounded_load.py``): a candidate whose active requests exceed ``factor * mean + slack`` (the
    mean over the pool's candidates) is not chosen, however much of the prompt it caches; the best of the others takes
    the request and computes (replicates) the prefix. ``factor`` is the ``c`` of consistent hashing with bounded
    loads; ``slack`` keeps a nearly idle pool (mean close to 0) from refusing a worker its second request."""

    factor: Annotated[float, Field(ge=1.0)] = 1.5
    slack: NonNegative = 2.0


class SessionSettings(_Strict):
    """What the ``live_sessions`` scorer counts: prefixes (conversations, shared documents) a worker served within
    the last ``window_s`` seconds and not since continued elsewhere: the work it is expected to be asked to continue.
    The scorer only speaks for requests without a cache hit (no candidate caches ``min_hit_fraction`` more of the
    prompt than another); with a hit the cache decides."""

    window_s: Annotated[float, Field(gt=0)] = 30.0
    min_hit_fraction: Annotated[float, Field(gt=0, le=1)] = 0.1
    max_tracked: Annotated[int, Field(ge=1)] = 100_000
    """Bound on tracked prefixes (the oldest go first)."""
    expect: Literal["count", "next_turns"] = "next_turns"
    """``count``: the live sessions each worker holds; ``next_turns``: the next turns each worker is expected to get
    while this prompt would be computed there (its sessions whose last call ended, at the measured gaps between an
    answer and the next turn: ``routing/kv/live_sessions.py``), so a new conversation's cold prompt avoids workers
    whose conversations are about to come back; the count stays as a bound (``count_bound``)."""
    count_bound: NonNegative | None = 0.0
    """With ``next_turns``: a candidate holding more than the candidates' mean + ``count_bound`` live sessions is
    passed over for a new conversation (scored below every candidate within the bound), so the order by next turns
    soon cannot pile conversations onto workers whose own happen to be generating (0: conversations stay as even as
    with ``count``; next turns order the workers at or below the mean). None: no bound."""


class ProfileSettings(_Strict):
    """How one pool's worker is chosen."""

    weights: dict[str, NonNegative]
    """Scorer name (``scorers.SCORERS``) -> weight. Empty: every candidate ties (the tie-break decides)."""
    cost: CostWeights = CostWeights()
    temperature: NonNegative = 0.0
    """0: the best total wins. Above 0: sample with softmax(total / temperature)."""
    tie_break: TieBreak = "least_loaded"
    """Among candidates tied on the best total: ``least_loaded`` (fewest active requests, then random) or
    ``rotate`` (take turns, in candidate order)."""
    bounded_load: BoundedLoadSettings | None = None
    """None: off. Else candidates above the load bound are not chosen (hot prefixes spread over replicas)."""
    sessions: SessionSettings = SessionSettings()
    """The ``live_sessions`` scorer's window (used when it is weighted)."""

    @field_validator("weights")
    @classmethod
    def _known_scorers(cls, weights: dict[str, float]) -> dict[str, float]:
        from litellm_disagg.routing.pipeline.scorers import SCORERS  # the table imports this module's CostWeights

        unknown = sorted(set(weights) - set(SCORERS))
        if unknown:
            raise ValueError(f"unknown scorer(s) {unknown}; choose from {sorted(SCORERS)}")
        if weights and not any(w > 0 for w in weights.values()):
            raise ValueError("a profile needs at least one scorer with a positive weight")
        return weights


def least_inflight_profile() -> ProfileSettings:
    """Fewest requests this router has in flight; ties take turns."""
    return ProfileSettings(weights={"load": 1.0}, tie_break="rotate")


def round_robin_profile() -> ProfileSettings:
    """Every candidate in turn."""
    return ProfileSettings(weights={}, tie_break="rotate")


def kv_prefill_profile() -> ProfileSettings:
    # Prefill workers: finish this prompt soonest = fewest (uncached + queued) tokens.
    return ProfileSettings(weights={"kv_cost": 1.0}, cost=CostWeights(prefill=1.0, decode=0.0, active=0.0))


def kv_decode_profile() -> ProfileSettings:
    # Decode workers (and aggregated ones, which prefill locally): the time to this request's first token is the
    # prefill it must compute plus what is queued ahead of it, so the cost counts uncached and queued prefill blocks
    # and running requests, not the KV blocks in use (memory is kv_free's concern: with decode=1, one running
    # request outweighed a cached prefix of its size and affinity flipped to idle workers; bench/serving measured
    # it). prefix_overlap keeps a conversation on its cache when a holder's queue is a little longer than an idle
    # worker's.
    # bounded_load: a hot prefix's holder over 1.5x the mean load (+2 requests) is passed over and the prefix
    # replicates; live_sessions: a new conversation (no cache hit) goes where fewer live sessions will come back.
    return ProfileSettings(
        weights={"kv_cost": 1.0, "kv_free": 0.25, "prefix_overlap": 0.5, "live_sessions": 1.0},
        cost=CostWeights(prefill=1.0, decode=0.0, active=1.0),
        bounded_load=BoundedLoadSettings(),
    )


PICKER_PROFILES: Mapping[str, Callable[[], ProfileSettings]] = MappingProxyType(
    {"least_inflight": least_inflight_profile, "round_robin": round_robin_profile}
)
"""``picker:`` names (routing without KV) -> their profile, for both pools."""
