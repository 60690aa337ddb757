"""WorkerPool: an immutable snapshot of the workers discovery knows, indexed for routing.

Built once per discovery change, read by every request without locks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from litellm_disagg.runtime_config import RuntimeConfig


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

    def prefill_candidates(self, model: str, *, exclude: Iterable[str] = ()) -> list[RuntimeConfig]:
        """Ready workers that can prefill for ``model`` (served model name), minus ``exclude``d ids."""
        skip = set(exclude)
        return [w for w in self.workers if w.model == model and w.routable and w.role.can_prefill and w.worker_id not in skip]

    def decode_candidates(self, model: str) -> list[RuntimeConfig]:
        return [w for w in self.workers if w.model == model and w.routable and w.role.can_decode]
