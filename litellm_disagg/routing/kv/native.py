"""The compiled core of KV routing, when it is built, else nothing: callers keep their pure-Python definitions.

``_kvcore`` (Cython, built in place by ``scripts/build_native.sh``, which ``scripts/setup.sh`` runs) holds compiled
twins of the hot loops: ``block_hash.chain_hashes`` and ``PrefixIndex``'s prefix walk, precise store and removal,
over ``MaskTable``, the index's ``hash -> slot mask`` table as C integers (a dict stays the pure-Python reference),
and ``PreciseSink``, a precise worker's ``PrefixIndex.stored`` / ``removed`` that ``_kvwire`` calls without a Python
frame.
``_kvwire`` (built by the same script) is the compiled KV-event path: one vLLM message read from its msgpack bytes
and applied to an ``EventApplier`` (``apply_message``), the twin of ``decode_message`` + ``EventApplier.apply``.
Each twin returns what its Python definition returns on the same inputs (``tests/kv/test_native.py`` and
``tests/kv/test_kv_wire.py`` run both on the same inputs and compare). The package imports and works without them:

- ``NATIVE``: whether the compiled core is in use; ``WHY``: why not (missing, disabled, failed its check);
- ``wire``: ``_kvwire`` when it is built and the compiled core is in use (it computes the same hashes), else None;
- ``LITELLM_DISAGG_PURE_PYTHON=1`` in the environment disables it (the comparison tests and benchmarks use it);
- at import the compiled block hash is checked against the Python definition (CPython's tuple hash, which the
  compiled code repeats without building tuples); any difference, e.g. another interpreter's tuple hash, disables it.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

logger = logging.getLogger(__name__)

DISABLE_ENV = "LITELLM_DISAGG_PURE_PYTHON"

core: ModuleType | None = None
WHY = ""


def _reference(tokens: list[int], block_size: int, parent: int) -> list[int]:
    h = parent
    return [h := hash((h, block)) for block in zip(*[iter(tokens)] * block_size, strict=False)]


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return None, f"disabled by {DISABLE_ENV}"
    try:
        from litellm_disagg.routing.kv import _kvcore  # type: ignore[attr-defined]  # compiled, may be absent
    except ImportError as exc:
        return None, f"not built ({exc}); scripts/build_native.sh builds it"
    try:
        ok = _kvcore.tuple_hash_constants_ok()
        probe = [(i * 2654435761) % 50_000 for i in range(1000)] + [0, -1, 2**40, -(2**62), 2**63 - 1]
        for parent in (0, -1, -2, 2**61 - 1, 2**61, -(2**63), 2**63 - 1, 1234567890123456789):
            for size in (1, 3, 16):
                ok = ok and _kvcore.chain_hashes(probe, size, parent) == _reference(probe, size, parent)
    except Exception as exc:  # noqa: BLE001 - any failure means: do not use it
        return None, f"failed its check: {exc}"
    if not ok:
        return None, "its block hashes differ from this interpreter's tuple hash"
    return _kvcore, ""


def _load_wire() -> ModuleType | None:
    if core is None:
        return None
    try:
        from litellm_disagg.routing.kv import _kvwire  # type: ignore[attr-defined]  # compiled, may be absent
    except ImportError as exc:
        logger.debug("compiled KV-event path not in use: not built (%s)", exc)
        return None
    return _kvwire


core, WHY = _load()
NATIVE = core is not None
if not NATIVE:
    logger.debug("compiled KV routing core not in use: %s", WHY)
wire: ModuleType | None = _load_wire()
