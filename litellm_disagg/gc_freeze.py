"""The proxy's start-up heap, moved out of the garbage collector's full collections (``gc.freeze``).

A LiteLLM proxy holds millions of objects from its start-up (imported modules, the model cost map, pydantic models).
CPython's full (generation 2) collection walks all of them: measured at 801 ms in one collection, in a KV-routing
proxy in front of 32 simulated workers at 8 requests/s (``bench.serving.pd --prefill 16 --decode 16``; probe of
2026-12-03). Every request in flight waits that long: it was the whole TTFT p99 of that benchmark. Those objects
live as long as the process, so scanning them never frees anything. Once litellm-disagg has attached to the proxy's
router, ``freeze`` moves every object tracked so far into the permanent generation; later full collections walk
only what was allocated since. Garbage left from start-up stays allocated (a one-time cost, never scanned again).

``LITELLM_DISAGG_GC_FREEZE=0`` leaves the collector as it is.
"""

from __future__ import annotations

import gc
import logging
import os

logger = logging.getLogger(__name__)

ENV = "LITELLM_DISAGG_GC_FREEZE"

_done = False


def freeze_startup_heap() -> int:
    """Freeze the objects tracked now (once per process; not when ``LITELLM_DISAGG_GC_FREEZE`` is ``0``). Returns how
    many were frozen by this call."""
    global _done
    if _done or os.environ.get(ENV, "1").strip().lower() in {"0", "false", "no", "off"}:
        return 0
    _done = True
    before = gc.get_freeze_count()
    gc.freeze()
    frozen = gc.get_freeze_count() - before
    logger.info("%d objects from the proxy's start-up left out of full garbage collections (gc.freeze)", frozen)
    return frozen
