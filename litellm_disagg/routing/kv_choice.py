"""KV-aware choice of one request's workers: the seam between the strategy and ``routing.kv``.

With ``kv_routing.enabled``, instead of the plain picker: tokenize the prompt (the engine's own tokens), score both
pools on cached prefix and load in one index query, pick the decode worker, rank the prefill workers (the failover
order) and decide whether a remote prefill pays off at all (conditional disaggregation). After the request is
planned, record where its blocks now live and what the prefill cost, so the next decisions learn from it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from litellm_disagg.routing.kv.block_hash import PromptBlocks
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.selection import Selection
from litellm_disagg.routing.orchestrator import DecodePlan, Mode
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.runtime_config import RuntimeConfig


@dataclass(frozen=True)
class KVChoice:
    decode: RuntimeConfig
    prefill_order: list[RuntimeConfig]
    """Prefill workers best first; empty when the request should be prefilled locally."""
    local_reason: str | None
    prompt: PromptBlocks | None
    prefill_cached_tokens: dict[str, int]
    decode_selection: Selection
    prefill_selection: Selection
    reason: str

    def explain(self) -> str:
        """Per-worker scores of both pools and the decision (built on demand: it costs more than the choice)."""
        return f"decode {self.decode_selection.describe()}; prefill {self.prefill_selection.describe()}; {self.reason}"


async def choose(kv: KVRouter, pool: WorkerPool, request: DisaggRequest, candidates: list[RuntimeConfig]) -> KVChoice:
    model = candidates[0].model
    # A worker's /tokenize, when the proxy cannot tokenize locally: spread over the candidates, not always the first.
    asked = candidates[zlib.crc32(request.request_id.encode()) % len(candidates)]
    prompt = await kv.prompt(request, model, worker_url=asked.server_url) if request.splittable else None
    prefill_all = pool.prefill_candidates(model)
    decode_ids = {c.worker_id for c in candidates}
    ctx = kv.context(prompt, candidates + [p for p in prefill_all if p.worker_id not in decode_ids])
    decode_selection = kv.select_decode(prompt, candidates, ctx=ctx)
    decode = decode_selection.worker or candidates[0]
    prefill_candidates = [p for p in prefill_all if p.worker_id != decode.worker_id]
    prefill_selection = kv.select_prefill(prompt, prefill_candidates, ctx=ctx)
    decision = kv.decide(prompt, decode_selection, prefill_selection)
    by_id = {p.worker_id: p for p in prefill_candidates}
    order = [by_id[wid] for wid in prefill_selection.ranking() if wid in by_id] if decision.remote else []
    return KVChoice(
        decode=decode,
        prefill_order=order,
        local_reason=None if decision.remote else decision.reason,
        prompt=prompt,
        prefill_cached_tokens=dict(ctx.cached_tokens),
        decode_selection=decode_selection,
        prefill_selection=prefill_selection,
        reason=decision.reason,
    )


def started(kv: KVRouter, choice: KVChoice, key: str) -> None:
    """The decode is in flight from now on: its blocks, and its prompt if it will compute that itself."""
    prompt = choice.prompt
    if prompt is None:
        kv.tokens.start(key, choice.decode.worker_id)
        return
    local_tokens = prompt.num_tokens - choice.prefill_cached_tokens.get(choice.decode.worker_id, 0)
    kv.tokens.start(
        key,
        choice.decode.worker_id,
        prefill_tokens=local_tokens if not choice.prefill_order else 0,
        decode_blocks=prompt.num_blocks(choice.decode.block_size),
    )


def planned(kv: KVRouter, choice: KVChoice, plan: DecodePlan) -> None:
    """Where the prompt's blocks now live (until events confirm it), and what the remote prefill cost."""
    kv.routed(choice.prompt, plan.decode)
    if plan.mode is Mode.DISAGGREGATED and plan.prefill_worker_id is not None and choice.prompt is not None:
        prefill = next((p for p in choice.prefill_order if p.worker_id == plan.prefill_worker_id), None)
        if prefill is not None:
            kv.routed(choice.prompt, prefill)
        if plan.prefill_seconds is not None:
            computed = choice.prompt.num_tokens - choice.prefill_cached_tokens.get(plan.prefill_worker_id, 0)
            kv.decider.observe_prefill(max(computed, 1), plan.prefill_seconds)
