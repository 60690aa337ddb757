"""Context providers: where a decision's scoring context, its per-request prefill decision and its learning come from.

    prompt(request, candidates)     the request's tokens and block hashes, or None (route on load alone)
    context(prompt, candidates)     ScoringContext for every candidate of both pools (one index query)
    decide(prompt, decode, prefill) remote or local prefill (conditional disaggregation)
    observe(plan, prefill_worker, prefill_seconds)   what the plan did, so the next decisions learn from it

``LoadProvider`` (KV-aware routing off): loads from this router's own accounting, no prompt, remote prefill whenever a
prefill worker is available. ``routing.kv.router.KVRouter`` (on): the prefix index, scraped engine metrics and the
cost model of ``kv/disagg_decision.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.kv.disagg_decision import NO_PREFILL_WORKER, DisaggDecision
from litellm_disagg.routing.pipeline.context import ScoringContext, collect_loads
from litellm_disagg.routing.pipeline.selection import Selection
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.runtime_config import RuntimeConfig

if TYPE_CHECKING:
    from litellm_disagg.routing.kv.block_hash import PromptBlocks
    from litellm_disagg.routing.route_plan import RoutePlan


class ContextProvider(Protocol):
    async def prompt(self, request: DisaggRequest, candidates: Sequence[RuntimeConfig]) -> PromptBlocks | None: ...

    def context(self, prompt: PromptBlocks | None, candidates: Sequence[RuntimeConfig]) -> ScoringContext: ...

    def decide(self, prompt: PromptBlocks | None, decode: Selection, prefill: Selection) -> DisaggDecision: ...

    def observe(
        self, plan: RoutePlan, prefill_worker_id: str | None, prefill_seconds: float | None, *,
        call_id: str | None = None,
    ) -> None:
        """What the plan became: ``call_id`` (LiteLLM's, when known) is now sent to ``plan.decode``."""


class LoadProvider:
    """KV-aware routing off: this router's in-flight counts are the whole context."""

    def __init__(self, accounting: Accounting):
        self.accounting = accounting

    async def prompt(self, request: DisaggRequest, candidates: Sequence[RuntimeConfig]) -> PromptBlocks | None:
        return None

    def context(self, prompt: PromptBlocks | None, candidates: Sequence[RuntimeConfig]) -> ScoringContext:
        return ScoringContext(
            prompt_tokens=0, cached_tokens={}, loads=collect_loads(candidates, accounting=self.accounting),
            replica=self.accounting.replica_slot,
        )

    def decide(self, prompt: PromptBlocks | None, decode: Selection, prefill: Selection) -> DisaggDecision:
        if prefill.worker is None:
            return DisaggDecision(False, NO_PREFILL_WORKER)
        return DisaggDecision(True, "remote prefill whenever a prefill worker is available")

    def observe(
        self, plan: RoutePlan, prefill_worker_id: str | None, prefill_seconds: float | None, *,
        call_id: str | None = None,
    ) -> None:
        return None
