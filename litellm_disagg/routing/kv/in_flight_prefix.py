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

The same holds for a prompt prefilled remotely: the router records its decode worker as holding the prompt once
the remote prefill is done, but the decode worker holds it only when its pull has ended. A sibling request sent there
meanwhile finds no hit and computes the whole prompt locally, and that long step holds up the pull and the first
token of every remote-prefilled request headed there. Measured on ``bench.serving.pd`` (4P+4D, 2026-12-02): a cold
document's second request reached its decode worker 1.5 ms before the first one's pull ended, computed 2,077 tokens
there in one 123 ms step, and two remote-prefilled requests on that worker waited for it (``admit`` 86 ms,
``decode_first`` 122 ms): the KV arm's two slowest requests.

So, per candidate: the leading blocks that are only predicted (not held) do not count as cached while this router
still has prompt tokens being prefilled there or pulled there (``WorkerLoad.inflight_prefill_tokens`` plus
``inflight_pull_tokens``), at most that many tokens. Once that prefill or pull is done (the first token seen), the
blocks are there and count again, even before their event arrives. Pure.
"""

from __future__ import annotations


def usable_now(cached_tokens: int, held_tokens: int, inflight_prefill_tokens: int) -> int:
    """``cached_tokens`` (held or predicted leading tokens of the prompt on one worker) less the predicted-only part
    that the worker may still be computing or pulling: ``min(cached - held, tokens this router has being prefilled
    or pulled there)``."""
    pending = cached_tokens - held_tokens
    if pending <= 0 or inflight_prefill_tokens <= 0:
        return cached_tokens
    return cached_tokens - (pending if pending < inflight_prefill_tokens else inflight_prefill_tokens)
