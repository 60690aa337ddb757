"""Field-by-field sums of the decision's moments (``LineMoments``, ``GapMoments``): what proxy replicas pool
(``shared_estimates.py``)."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def add_fields(a: T, b: T) -> T:
    """``a + b`` of two instances of one slotted dataclass whose fields all add (numbers, or such dataclasses)."""
    slots: Any = type(a).__slots__  # type: ignore[attr-defined]
    return type(a)(*(getattr(a, name) + getattr(b, name) for name in slots))
