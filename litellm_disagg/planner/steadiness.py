"""Was the load steady over the last window: the spread of the model's windowed prompt rate. No I/O.

The engine profile's estimates (``mixing.py``) price a steady load at the window's mean rates. A window whose
arrivals came in bursts holds steps far busier than that mean (the bursts phase of the evaluation: three times the
mean rate for 4 s of every 20), so its ITL percentile is above what the mean-rate estimate says even where the
profile prices mixing exactly. ``calibration.py`` would read that as a profile underpricing mixing and raise the
correction, and the corrected estimate then split a load that every worker as ``both`` served best
(docs/planner-evaluation.md, "A window of bursts raises no correction"). So only a window whose load was steady
raises the correction; any window may lower it (a window of bursts shows an ITL above what its mean rates would, so
one within the margin shows mixing no dearer than that).

The measure: the planner's readings of the windowed prompt rate over the last ``window_s`` (one per step, each over
its own ``window_s``), largest over smallest. Poisson arrivals at a loaded rate keep it near 1 (the windows overlap);
a burst inside the span moves a window's rate by the burst's whole weight.

    RateHistory.observe(now, prompt_tokens_per_s, keep_s)   (one per step; readings older than ``keep_s`` dropped)
    RateHistory.swing(now, span_s) -> float | None          (largest / smallest reading over ``span_s``; None: too few)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RateReading:
    t: float
    prompt_tokens_per_s: float


@dataclass
class RateHistory:
    """One model's windowed prompt rates, as the planner read them step by step."""

    readings: deque[RateReading] = field(default_factory=deque)

    def observe(self, now: float, prompt_tokens_per_s: float | None, keep_s: float) -> None:
        """Record one step's reading (an unmeasured rate, None, records nothing) and drop those older than
        ``keep_s`` (the planner keeps one ``window_s``: the span it asks ``swing`` about)."""
        if prompt_tokens_per_s is not None and math.isfinite(prompt_tokens_per_s) and prompt_tokens_per_s >= 0:
            self.readings.append(RateReading(now, prompt_tokens_per_s))
        while self.readings and now - self.readings[0].t > keep_s:
            self.readings.popleft()

    def swing(self, now: float, span_s: float) -> float | None:
        """The largest reading over the smallest within the last ``span_s`` (a reading ``span_s`` old is out: it
        covers a window wholly before this one) (1.0: the same rate throughout; ``inf``: no prompt in one of the
        windows while another had some). None with fewer than two readings there (a planner stepping once a window
        or less often), or with no prompt in any of them (nothing to say about a load)."""
        rates = [r.prompt_tokens_per_s for r in self.readings if now - r.t < span_s]
        if len(rates) < 2 or max(rates) <= 0:
            return None
        low = min(rates)
        return math.inf if low <= 0 else max(rates) / low
