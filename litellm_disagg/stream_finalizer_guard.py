"""LiteLLM's stream wrappers write context variables from their finalizer; in the proxy, with correlation logging off,
that write does nothing and can crash CPython 3.11: skip it.

``CustomStreamWrapper.__del__`` (LiteLLM 1.108, ``litellm_core_utils/streaming_handler.py``) restores the request's
``trace_id``/``session_id`` context variables for a stream its caller abandoned. With
``litellm.request_correlation_in_logs`` off (LiteLLM's default), the call never stamped them, so its "guarded"
restore finds them equal to their pre-call values and sets them again to the same values: two ``ContextVar.set``
calls with no effect (``Logging._restore_correlation_context_if_unclaimed``).

But a finalizer runs wherever the garbage collector runs, and a wrapper sits in reference cycles, so the cyclic GC
collects it; the GC can run inside CPython's ``_PyHamt_Assoc``, which allocates while it walks the context's HAMT
during another ``ContextVar.set``. A set from the finalizer then frees that HAMT under the walk (python/cpython#148891;
the fix, #148928, is not in 3.11). A proxy running our strategy died twice of exactly that
(``hamt_node_bitmap_assoc``, an incref through a freed node: docs/operations.md).

``install()`` replaces ``__del__`` with one that does the restore only when correlation logging is on (then the
restore has something to undo, and the risk is LiteLLM's as it ships). Installed by the plugin in the proxy; once.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

_MARK = "_litellm_disagg_finalizer_guard"


def install() -> bool:
    """Guard ``CustomStreamWrapper.__del__``. False when there is nothing to guard (no such class or method in this
    LiteLLM) or it is already guarded."""
    try:
        from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper
    except ImportError:
        return False
    original = CustomStreamWrapper.__dict__.get("__del__")
    if original is None or getattr(original, _MARK, False):
        return False

    def __del__(self: Any) -> None:
        import litellm

        if getattr(litellm, "request_correlation_in_logs", True):
            original(self)

    setattr(__del__, _MARK, True)
    CustomStreamWrapper.__del__ = __del__  # type: ignore[method-assign]
    logger.debug("LiteLLM's stream wrapper finalizer skips its context-variable restore (correlation logging off)")
    return True
