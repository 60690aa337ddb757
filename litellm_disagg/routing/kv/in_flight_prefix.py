"""A prefix a worker is still computing is not a cache hit there yet.

The prefix index predicts a worker holds a prompt's blocks from the moment the router sends it the prompt, until the
worker's ``BlockStored`` confirms them (``prefix_index.py``), so that sibling requests find the prefix the first of
them computes. While that first prompt is still being prefilled, though, the engine cannot serve the blocks it has not
computed: vLLM (and the simulator) look a waiting request's prefix up in the cache when they admit it, behind the
running prefill's chunks, and compute whatever is not there yet again. A request sent to that worker then waits for
the whole running prefill (the cost's queued term) *and* computes most of the prefix anyway. Measured on the skewed
serving benchmark (``bench/serving/breakdown.py``): such requests took 264-306 ms to their first token (queue 60-150
ms, then a shared prefill) where a cold 5,000-token prompt on an idle worker takes about 210 ms; they were most of
the KV-aware arm's slowest requests.

So, per candidate: the leading blocks that are only predicted (not held) do not count as cached while this router
still has prompt tokens being prefilled there (``WorkerLoad.inflight_prefill_tokens``), at most that many tokens.
Once that prefill is done (its first token seen), the blocks are computed and count again, even before their event
arrives. Pure.
"""

from __future__ import annotations


def usable_now(cached_tokens: int, held_tokens: int, inflight_prefill_tokens: int) -> int:
    """``cached_tokens`` (held or predicted leading tokens of the prompt on one worker) less the predicted-only part
    that the worker may still be computing: ``min(cached - held, tokens this router has being prefilled there)``."""
    pending = cached_tokens - held_tokens
    if pending <= 0 or inflight_prefill_tokens <= 0:
        return cached_tokens
    return cached_tokens - (pending if pending < inflight_prefill_tokens else inflight_prefill_tokens)
