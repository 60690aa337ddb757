"""WorkerPool: an immutable snapshot of the workers discovery knows, indexed for routing.

Built once per discovery change, read by every request without locks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from litellm_disagg.routing.pipeline import filters
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole


@dataclass(frozen=True)
class WorkerPool:
    workers: tuple[RuntimeConfig, ...] = ()
    _by_id: dict[str, RuntimeConfig] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {w.worker_id: w for w in self.workers})

    @classmethod
    def of(cls, configs: Iterable[RuntimeConfig]) -> WorkerPool:
        return cls(tuple(sorted(configs, key=lambda w: w.worker_id)))

    def get(self, worker_id: str) -> RuntimeConfig | None:
        return self._by_id.get(worker_id)

    def for_model(self, model: str) -> list[RuntimeConfig]:
        """Every worker serving ``model`` (served model name), whatever its role and state."""
        return [w for w in self.workers if w.model == model]

    def prefill_candidates(self, model: str, *, exclude: Iterable[str] = ()) -> list[RuntimeConfig]:
        """Ready workers that can prefill for ``model``, minus ``exclude``d ids (the pipeline's filters)."""
        return filters.apply(
            (filters.routable, filters.role(WorkerRole.PREFILL), filters.excluded(set(exclude))), self.for_model(model)
        )

    def decode_candidates(self, model: str) -> list[RuntimeConfig]:
        """Ready workers that can decode for ``model`` (the pipeline's filters)."""
        return filters.apply((filters.routable, filters.role(WorkerRole.DECODE)), self.for_model(model))
