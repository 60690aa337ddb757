"""Where a benchmark reads its workers' per-request traces from, for ``breakdown.py``: the simulator's request log
(``litellm_disagg/sim/request_log.py``) or real vLLM workers' OpenTelemetry spans (``engine_traces.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.serving.engine_traces import SpanCollector, traces, wall_to_monotonic
from litellm_disagg.sim.request_log import RequestTrace
from litellm_disagg.sim.request_log import read as read_log


@dataclass
class TraceSource:
    request_log: Path | None = None
    """Simulated workers' request log."""
    spans: SpanCollector | None = None
    """Real vLLM workers' span receiver."""
    roles: Mapping[str, str] = field(default_factory=dict)
    """Worker id to role, for the spans (``both`` where unnamed)."""

    @property
    def empty(self) -> bool:
        """Nothing to read: the workers keep no log and export no spans (``--no-engine-traces``)."""
        return self.request_log is None and self.spans is None

    def mark(self) -> int:
        """Where the traces of what runs next begin (read before the load starts)."""
        if self.request_log is not None:
            return self.request_log.stat().st_size if self.request_log.exists() else 0
        return self.spans.count() if self.spans is not None else 0

    def since(self, mark: int) -> list[RequestTrace]:
        """The traces written after ``mark``; the spans once the workers have exported them all."""
        if self.request_log is not None:
            return read_log(self.request_log, mark)[0]
        if self.spans is None:
            return []
        return traces(self.spans.settle()[mark:], self.roles, wall_to_monotonic())

    def close(self) -> None:
        if self.spans is not None:
            self.spans.close()
