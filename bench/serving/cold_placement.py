"""Where cold prompts went when every worker was already computing one: the placement ``prefill_progress`` is for.

A cold prompt (at least ``COLD_TOKENS`` prompt tokens to compute) that reaches the workers while every one of them
is computing another cold prompt must wait behind one of those. The best it can do is the worker whose cold prompts
end first; the request log says, in hindsight, when each did (its first token). Per arm::

    contested   cold prompts that arrived while every worker computed a cold prompt
    best        of those, placed on the worker whose cold prompts ended first (within ``TOLERANCE_S``)
    extra_s     the wait they had beyond that worker's, summed

Pure: request traces in (``litellm_disagg.sim.request_log.RequestTrace``, the simulated workers' ``requests.jsonl``),
figures out. The worker that computed a prompt is the one whose trace has it neither cached nor pulled: the
aggregated worker, a remote prefill's prefill worker, or a decode worker that prefilled it locally. Workers are
compared within their pool (the traces' role): a remote prefill against the prefill pool, a local one against the
decode pool.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from litellm_disagg.sim.request_log import RequestTrace

COLD_TOKENS = 1024
"""Prompt tokens to compute from which a prompt counts as cold (``breakdown.LONG_PREFILL_AHEAD``'s size)."""

TOLERANCE_S = 0.01
"""A placement within this of the best worker's end counts as the best (two workers ending together)."""


@dataclass(frozen=True)
class ColdPlacement:
    contested: int = 0
    best: int = 0
    extra_s: float = 0.0

    def line(self) -> str:
        if not self.contested:
            return "  cold prompts arriving while every worker computed one: none"
        return (f"  cold prompts arriving while every worker computed one: {self.contested}; on the worker that "
                f"finished first: {self.best}; waited beyond it: {self.extra_s * 1e3:.0f} ms in all")


def _computed(t: RequestTrace) -> int:
    return t.prompt_tokens - t.cached_tokens - t.external_tokens


def cold_placement(traces: Iterable[RequestTrace]) -> ColdPlacement:
    done = [t for t in traces if t.first_token is not None]
    first = {id(t): t.first_token or 0.0 for t in done}
    pools: dict[str, set[str]] = defaultdict(set)
    for t in done:
        pools[t.role].add(t.worker_id)
    cold = sorted((t for t in done if _computed(t) >= COLD_TOKENS), key=lambda t: t.arrived)
    by_worker: dict[str, list[RequestTrace]] = defaultdict(list)
    for t in cold:
        by_worker[t.worker_id].append(t)
    contested = best = 0
    extra = 0.0
    for c in cold:
        at = c.arrived
        ends: dict[str, float] = {}
        for worker in pools[c.role]:
            busy = [first[id(o)] for o in by_worker[worker] if o is not c and o.arrived < at < first[id(o)]]
            if not busy:
                break
            ends[worker] = max(busy)
        else:
            chosen = ends.get(c.worker_id)
            if chosen is None:
                continue
            contested += 1
            wait = chosen - min(ends.values())
            if wait <= TOLERANCE_S:
                best += 1
            extra += wait
    return ColdPlacement(contested, best, extra)
