"""The route plan: one request's decode worker, its prefill workers in failover order, or why it prefills locally.

    RoutePlanner.plan(request, pool, decode candidates)
        filters (both pools) ─► context provider (prompt, cached tokens, loads: one query for both pools)
        ─► decode pipeline ─► prefill pipeline (minus the decode worker) ─► remote-or-local decision ─► RoutePlan

The one place a request's workers are chosen, KV-aware routing on or off (the profiles and the context provider
differ, not the code). No state changes here except the pickers' RNG and rotation; the strategy records the decode in
``Accounting``, the orchestrator walks ``prefill_order``, and ``observe`` tells the provider what happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from litellm_disagg.engines import transfer_for
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.kv.disagg_decision import NO_PREFILL_WORKER, DisaggDecision, DisaggInputs
from litellm_disagg.routing.pipeline import filters
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.providers import ContextProvider
from litellm_disagg.routing.pipeline.selection import Selection
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole

if TYPE_CHECKING:
    from litellm_disagg.routing.kv.block_hash import PromptBlocks

NOT_SPLITTABLE = "request has several prompts or completions"
DECODE_CANNOT_PREFILL = "the decode worker cannot prefill (its engine's decode mode needs a remote prefill)"
ONLY_ITSELF = "an aggregated worker with no other worker able to prefill for it"
"""A ``both`` worker whose model has no other routable prefill-capable worker (one ``both`` worker, or a pool the
planner made all but one decode): prefilling its own prompts is the layout, not a fallback; a choice the orchestrator
never refuses."""


def serves_alone(decode: RuntimeConfig) -> bool:
    """Whether ``decode`` can compute a prompt itself: any worker that can prefill, or whose engine allows it."""
    return decode.role.can_prefill or transfer_for(decode).decode_serves_alone


def _others_can_prefill(pool: WorkerPool, decode: RuntimeConfig) -> bool:
    """Whether a routable worker other than ``decode`` could prefill for it (in failure cooldown or not)."""
    return any(
        w.worker_id != decode.worker_id
        for w in filters.apply((filters.routable, filters.role(WorkerRole.PREFILL), filters.same_transfer(decode)),
                               pool.for_model(decode.model))
    )


class NoDecodeWorker(Exception):
    """No candidate can decode this request."""


@dataclass(frozen=True)
class RoutePlan:
    decode: RuntimeConfig
    prefill_order: tuple[RuntimeConfig, ...]
    """Prefill workers to try, best first; empty when the decode worker prefills (by choice or for lack of any)."""
    local_reason: str | None
    """Set when the decode worker prefills by choice (the decision, or a request that cannot be split): not a
    fallback. None with an empty ``prefill_order``: no prefill worker was available (a fallback)."""
    reason: str
    """The remote-or-local decision's reason."""
    prompt: PromptBlocks | None = None
    cached_tokens: Mapping[str, int] = field(default_factory=dict)
    decode_selection: Selection = field(default_factory=lambda: Selection(None, "none"))
    prefill_selection: Selection = field(default_factory=lambda: Selection(None, "none"))
    remote_cost_s: float | None = None
    local_cost_s: float | None = None
    """The decision's estimates (KV routing's cost model), when it computed them."""
    decision_inputs: DisaggInputs | None = None
    """What the decision priced, when it priced anything (the first-token observation's tokens and backlog)."""

    @property
    def local_prefill_tokens(self) -> int:
        """Prompt tokens the decode worker computes itself under this plan (0 when unknown or prefilled remotely)."""
        if self.prompt is None or self.prefill_order:
            return 0
        return self.prompt.num_tokens - self.cached_tokens.get(self.decode.worker_id, 0)

    @property
    def pull_tokens(self) -> int:
        """Prompt tokens whose KV the decode worker pulls under this plan (0 when unknown or prefilled locally):
        until they arrive, the blocks the router predicts there are not there yet."""
        if self.prompt is None or not self.prefill_order:
            return 0
        return max(0, self.prompt.num_tokens - self.cached_tokens.get(self.decode.worker_id, 0))

    @property
    def decode_blocks(self) -> int:
        return 0 if self.prompt is None else self.prompt.num_blocks(self.decode.block_size)

    def prefill_tokens_on(self, worker_id: str) -> int:
        """Prompt tokens ``worker_id`` computes when it prefills this request (0 when unknown)."""
        if self.prompt is None:
            return 0
        return max(0, self.prompt.num_tokens - self.cached_tokens.get(worker_id, 0))

    def explain(self) -> str:
        """Per-worker scores of both pools and the decision (built on demand: it costs more than the choice)."""
        return f"decode {self.decode_selection.describe()}; prefill {self.prefill_selection.describe()}; {self.reason}"


class RoutePlanner:
    def __init__(
        self, *, provider: ContextProvider, decode: Pipeline, prefill: Pipeline, cooldown: FailureCooldown
    ):
        self.provider = provider
        self.decode = decode
        self.prefill = prefill
        self.cooldown = cooldown

    async def plan(
        self, request: DisaggRequest, pool: WorkerPool, candidates: Sequence[RuntimeConfig]
    ) -> RoutePlan:
        """``candidates``: the decode workers LiteLLM considers healthy for this call (its deployments)."""
        decode_candidates = filters.apply(
            (filters.routable, filters.role(WorkerRole.DECODE), filters.cooldown(self.cooldown)), candidates
        )
        if not decode_candidates:
            raise NoDecodeWorker("no ready decode worker")
        model = decode_candidates[0].model
        prefill_all = filters.apply(
            (filters.routable, filters.role(WorkerRole.PREFILL), filters.cooldown(self.cooldown)),
            pool.for_model(model),
        )
        prompt = await self.provider.prompt(request, decode_candidates) if request.splittable else None
        decode_ids = {w.worker_id for w in decode_candidates}
        ctx = self.provider.context(
            prompt, decode_candidates + [p for p in prefill_all if p.worker_id not in decode_ids]
        )
        decode_selection = self.decode.select(ctx, decode_candidates)
        decode = decode_selection.worker or decode_candidates[0]
        # A worker never prefills for itself: that is just aggregated serving. KV moves only between workers of one
        # engine speaking one transfer protocol (vLLM's pull and push connectors do not talk to each other).
        prefill_candidates = filters.apply(
            (filters.excluded((decode.worker_id,)), filters.same_transfer(decode)), prefill_all
        )
        prefill_selection = self.prefill.select(ctx, prefill_candidates)
        common = dict(
            prompt=prompt,
            cached_tokens=ctx.cached_tokens,
            decode_selection=decode_selection,
            prefill_selection=prefill_selection,
        )
        if not request.splittable:
            return RoutePlan(decode, (), NOT_SPLITTABLE, NOT_SPLITTABLE, **common)  # type: ignore[arg-type]
        decision = self.provider.decide(prompt, decode_selection, prefill_selection)
        common.update(
            remote_cost_s=decision.remote_cost_s, local_cost_s=decision.local_cost_s, decision_inputs=decision.inputs
        )
        if not decision.remote and prefill_candidates and not serves_alone(decode):
            decision = DisaggDecision(True, DECODE_CANNOT_PREFILL)
        if decision.remote:
            by_id = {p.worker_id: p for p in prefill_candidates}
            order = tuple(by_id[wid] for wid in prefill_selection.ranking() if wid in by_id)
            return RoutePlan(decode, order, None, decision.reason, **common)  # type: ignore[arg-type]
        # No prefill worker at all is a fallback (the orchestrator may refuse it), not a choice, unless the decode worker
        # is an aggregated one and nothing else could prefill for it even out of cooldown: then it is the layout.
        if decision.reason == NO_PREFILL_WORKER:
            if decode.role.can_prefill and not _others_can_prefill(pool, decode):
                return RoutePlan(decode, (), ONLY_ITSELF, ONLY_ITSELF, **common)  # type: ignore[arg-type]
            return RoutePlan(decode, (), None, decision.reason, **common)  # type: ignore[arg-type]
        return RoutePlan(decode, (), decision.reason, decision.reason, **common)  # type: ignore[arg-type]

    def replacement_decode(
        self, plan: RoutePlan, pool: WorkerPool, candidates: Sequence[RuntimeConfig], *, prefill_worker_id: str | None
    ) -> RuntimeConfig | None:
        """After the prefill: another decode worker when ``plan.decode`` died meanwhile (discovery dropped it, or it
        refuses connections: ``routing/liveness.py``); None when it is still there, or when the decode's fields
        were made for it (a concurrent protocol: SGLang's bootstrap room, vLLM's push). A sequential prefill's KV is
        pulled by whichever decode worker gets its fields, so the request keeps its prefill instead of failing at
        the dead worker's port and being retried with a fresh one."""
        dead = plan.decode
        if pool.get(dead.worker_id) is not None and not self.cooldown.held(dead):
            return None
        if prefill_worker_id is not None and transfer_for(dead).concurrent:
            return None
        others = [
            w for c in candidates
            if (w := pool.get(c.worker_id)) is not None and w.worker_id not in (dead.worker_id, prefill_worker_id)
            and w.engine == dead.engine and w.transfer.kind == dead.transfer.kind
            and (prefill_worker_id is not None or serves_alone(w))
        ]  # fmt: skip
        others = filters.apply(
            (filters.routable, filters.role(WorkerRole.DECODE), filters.cooldown(self.cooldown)), others
        )
        others = [w for w in others if not self.cooldown.held(w)]
        if not others:
            return None
        selection = self.decode.select(self.provider.context(plan.prompt, others), others)
        return selection.worker or others[0]

    def observe(
        self, plan: RoutePlan, prefill_worker_id: str | None, prefill_seconds: float | None, *,
        call_id: str | None = None,
    ) -> None:
        self.provider.observe(plan, prefill_worker_id, prefill_seconds, call_id=call_id)
