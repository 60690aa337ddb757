"""The engine profile checked against what the ``both`` workers show: a correction of the mixed-step estimate. Pure;
no I/O.

    mixing_correction(previous, observed_itl_ms, estimated_itl_ms, margin) -> float

The crossing to aggregated serving (``policy.aggregation_pays``) trusts ``mixing.aggregated_estimate``: a mean step
computed from the operator's profile, held under ``headroom`` of the ITL SLO because the SLO is a percentile of
requests and a real mixed step costs more than the model's. That margin is all that stands between a profile that
underprices mixing and a crossing that breaks the ITL (docs/planner-evaluation.md, "A profile measured wrong": a
profile 20-30% optimistic crossed a prompt-heavy load to ``both`` and left it there, its ITL at 1.5x the SLO while
the estimate said 0.65x).

Every worker ``both`` is the one layout the estimate describes, so it is the one where the profile can be checked:
after a whole latency window on that layout, the observed ITL percentile should be within the margin of the estimate
(``observed <= estimate / margin``). Where it is not, the profile underprices mixing by ``observed x margin /
estimate``, and that factor multiplies every later mixed-step estimate of the model. This is Dynamo's planner's
correction factor (observed over expected latency, applied to its profile's predictions), used one way: it only
corrects toward dearer mixing. A profile that overprices mixing costs at worst the no-profile behaviour; one that
underprices it crosses where mixing breaks the ITL, and a window of a well-served low load must not undo what a
loaded window showed. So the correction rises at once to what a window shows, and falls halfway toward it (never
under 1.0) on a window that shows less, at most once per window. Only a window of a steady load raises it (the
policy asks ``steadiness.py``): the estimate prices the window's mean rates, and a window of bursts shows an ITL
above what those rates would; it may still lower it.

The operator can make the same check before the planner is given the profile (``litellm-disagg profile
--check-load``, ``mixing_check.py``); its largest correction is the profile's ``mixing_correction``, the planner's
starting value, which its own windows then move as any other. Not a floor: one worker under Poisson arrivals shows
a longer tail than a pool the router spreads the load over (on the simulated engine the exact profile checked for
240 s a load got 1.04-1.13, and up to 1.67 over 60 s, where the pool's windows showed none), and a correction too
high lifts ``disaggregation_pays``'s burst guard, which reads the same estimate (docs/planner-evaluation.md, "The
profile checked against the ITL": as a floor, 1.67 cost a bursts timeline 61%).
"""

from __future__ import annotations


def observed_factor(observed_itl_ms: float, estimated_itl_ms: float, margin: float) -> float:
    """How much dearer mixing is than the estimate, beyond what ``margin`` (the share of the SLO the estimate is held
    under, ``headroom``) allows for: ``observed x margin / estimate``; 1.0 or less: the margin covered it."""
    if estimated_itl_ms <= 0:
        return 1.0
    return observed_itl_ms * margin / estimated_itl_ms


def mixing_correction(previous: float, observed_itl_ms: float | None, estimated_itl_ms: float | None,
                      margin: float, *, may_lower: bool = True, may_raise: bool = True) -> float:
    """The correction after one settled window of every worker ``both``: up at once to the window's factor when that
    is higher (``may_raise``: the window's load was steady; a window of bursts shows an ITL above what its mean rates
    would, so it never shows mixing dearer), else (``may_lower``: the policy lowers it once per window, not at every
    step over the same requests) halfway down toward it, never under 1.0. ``previous`` when the window says nothing
    (no ITL percentile, or no finite estimate: the workers would not keep up with their prompts)."""
    if observed_itl_ms is None or estimated_itl_ms is None:
        return previous
    factor = observed_factor(observed_itl_ms, estimated_itl_ms, margin)
    if factor >= previous:
        return factor if may_raise else previous
    if not may_lower:
        return previous
    return max(1.0, previous - 0.5 * (previous - max(1.0, factor)))
