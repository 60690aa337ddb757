"""A crossing to aggregated serving that the first tokens refuted. Pure; no I/O.

    TtftRefutation.crossed(prefill, rate)            the first move of an ``aggregation_pays`` crossing
    TtftRefutation.settled(prefill, rate, swing_max) a settled window of every worker ``both`` after it -> refuted?
    TtftRefutation.lighter(rate, swing_max)          a clearly lighter load forgets a refutation
    TtftRefutation.blocks                            ``aggregation_pays`` is off
    TtftRefutation.back_to                           the split to go back to (``aggregation_refuted``)

``aggregation_pays`` crosses a split that misses an SLO to ``both`` when the engine profile's estimate holds the
ITL of every worker as ``both`` at the measured load and keeps up with the prompts (their share of the workers' time
under ``aggregate_busy_max``). The estimate prices the ITL; it says nothing of the first tokens' wait. The ITL side
is checked on the layout it made (``calibration.py``: the mixing correction); this is the same check for the TTFT.

A crossing decided on the prefill side (its pressure over 1: the split missed the TTFT SLO) is refuted when, on
the settled layout of every worker ``both`` at the same load (the prompt rate within ``steady_swing_max`` of the
crossing's either way), two readings a whole ``window_s`` apart both show the prefill pressure over 1 and no lower
than the split's, the later one no lower than the earlier: aggregated serving did not fix what it was chosen to
fix. One window is not enough: the backlog the split left behind drains on the ``both`` workers, and its first
tokens fill the first settled window however well they keep up (in the simulated evaluation a one-window check
refuted a prompt-heavy crossing that paid, and the planner's goodput there fell from 27.0-27.5 to 15.8-27.5
requests/s); a falling reading waits for the next window. Ending the check takes two readings in a row better than
the split's (or within the SLO), as refuting it takes two no better: at a few requests a minute a window holds
five first tokens, and on real CPU workers one better reading (1.19x the SLO against the split's 1.55x) ended a check
whose next window read 1.68x (docs/benchmarks.md, "Again after `72bb16b`"). Nothing else leads back: every worker ``both``, ``prefill_bound``
has no move (a prefill worker beside only ``both`` workers gets no prompts: they serve their own), and the ITL,
which the estimate did price, holds. So a refuted crossing goes back to the split it came from
(``aggregation_refuted``: its prefill and decode worker counts, the ``both`` workers moved at once, skipping the
cooldown the crossing gave them), and turns ``aggregation_pays`` off for the model until its prompt rate falls
below the refuted one by more than ``steady_swing_max`` (a lighter load is a new question); without that memory the
split's TTFT miss would meet the same estimate and cross again. A higher load keeps it off: more prompts only
lengthen the wait aggregated serving failed to shorten.

On two real CPU workers with a measured profile (``bench/planner_crossing.py``, docs/benchmarks.md) the one crossing
the estimate decided had the split's TTFT p90 at 12.5 s over a 9.9 s SLO and the ``both`` layout's at 18 s after it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Crossing:
    """The split's side of a crossing to ``both``: its prefill pressure, the model's prompt rate (tokens/s), and its
    prefill and decode workers."""

    prefill: float
    prompt_rate: float | None
    prefill_workers: int
    decode_workers: int


@dataclass
class TtftRefutation:
    """One model's memory of its last TTFT-driven crossing (see the module docstring)."""

    pending: Crossing | None = None
    """A crossing decided on a prefill pressure over 1, not yet checked on a settled ``both`` layout."""
    refuted_rate: float | None = None
    """The prompt rate at which a crossing was refuted (``aggregation_pays`` is off near and above it)."""
    back_to: tuple[int, int] | None = None
    """(prefill, decode) workers of the split a refuted crossing came from, until the ``both`` workers are back."""
    reading: float | None = None
    """The pending crossing's last settled prefill pressure, over 1 and no lower than the split's."""
    reading_at: float | None = None
    better: bool = False
    """The pending crossing's last settled reading was better than the split's (one more ends the check)."""

    def crossed(self, prefill: float | None, prompt_rate: float | None, split: tuple[int, int]) -> None:
        """The first move of a crossing; ``prefill``: the split's prefill pressure (None: not measured); ``split``:
        its (prefill, decode) workers. Only a crossing for the prefill side (over 1) is checked here: an ITL-driven
        one has the mixing correction."""
        self.back_to = self.reading = self.reading_at = None
        self.better = False
        self.pending = (Crossing(prefill, prompt_rate, *split) if prefill is not None and prefill > 1.0 else None)

    def settled(self, prefill: float | None, prompt_rate: float | None, swing_max: float, *, now: float,
                window_s: float) -> bool:
        """A step on a settled layout of every worker ``both`` (``policy.all_both_settled``) after the pending
        crossing, its prefill pressure ``prefill`` (None: not measured, the check waits) at ``prompt_rate``: True
        when it refutes the crossing (it is then remembered; see the module docstring). Readings are compared a
        whole ``window_s`` apart (each window holds new first tokens)."""
        crossing = self.pending
        if crossing is None or prefill is None:
            return False
        if self.reading_at is not None and now - self.reading_at < window_s:
            return False
        if not _same_load(crossing.prompt_rate, prompt_rate, swing_max):
            return False  # another load: no reading either way (at a few requests a minute the rate is noisy)
        if prefill <= 1.0 or prefill < crossing.prefill:
            if self.better:
                self._end_check()  # two readings in a row better than the split's: it paid
                return False
            self.better, self.reading, self.reading_at = True, None, now
            return False
        self.better = False
        if self.reading is None or prefill < self.reading:
            self.reading, self.reading_at = prefill, now   # still falling: a backlog the split left drains
            return False
        self._end_check()
        self.refuted_rate = crossing.prompt_rate if crossing.prompt_rate is not None else prompt_rate
        self.back_to = (crossing.prefill_workers, crossing.decode_workers)
        return True

    def moved(self) -> None:
        """A move of another condition: the layout is no longer the crossing's, whose check is over."""
        self._end_check()

    def _end_check(self) -> None:
        """The pending crossing's check is over (paid, refuted, or its layout left): nothing pending, no reading."""
        self.pending = self.reading = self.reading_at = None
        self.better = False

    def way_back(self, workers: int, both: int) -> tuple[int, int] | None:
        """The (prefill, decode) split to move the model's ``workers`` to, ``both`` of them ``both`` now; None when
        there is none to go back to (or the ``both`` workers are back: the way back is over). The crossing's counts,
        fitted to the workers there are now (at least one of each)."""
        if self.back_to is None or both == 0 or workers < 2:
            self.back_to = None
            return None
        prefill = min(max(1, self.back_to[0]), workers - 1)
        return prefill, workers - prefill

    def lighter(self, prompt_rate: float | None, swing_max: float, *, measured: bool = True) -> None:
        """A step's load: a refuted crossing is forgotten at a clearly lighter one (a new question), ``measured``
        (the latency window holds ``min_samples`` first tokens) and not zero; an unknown or zero rate keeps it (a 10
        s window at a few requests a minute often holds no arrival, and a model that is idle is ``low_load``'s, not
        this check's)."""
        if (self.refuted_rate is not None and measured and prompt_rate is not None and 0.0 < prompt_rate
                and prompt_rate * swing_max < self.refuted_rate):
            self.refuted_rate = None
            self.back_to = None

    @property
    def blocks(self) -> bool:
        """Whether ``aggregation_pays`` is off: a crossing was refuted and no clearly lighter load (``lighter``) has
        come since."""
        return self.refuted_rate is not None


def _same_load(before: float | None, now: float | None, swing_max: float) -> bool:
    """Whether two prompt rates are one load (within ``swing_max`` of each other; unknown: taken as the same)."""
    if before is None or now is None or before <= 0 or now <= 0:
        return True
    return max(before, now) / min(before, now) <= swing_max
