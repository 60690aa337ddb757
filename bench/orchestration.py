"""TTFT of sequential vs concurrent orchestration, on simulated workers, at several prompt lengths, in one run.

    .venv/bin/python -m bench.orchestration [--lengths 256,1024,4096,7000] [--requests 6] [--runs 3] [--speedup 1]

Three simulated prefill/decode pairs with the same timing model (70B-class on H100s, ``litellm_disagg/sim``):

- ``sequential``: vLLM's NixlConnector protocol. The router's ``Orchestrator`` sends the prefill and waits for its
  answer (``kv_transfer_params``); only then does the decode request start, and the decode pulls the KV.
- ``concurrent``: SGLang's bootstrap protocol. The ``Orchestrator`` opens a room and starts the prefill in the
  background; the decode request starts at once, registers the room and allocates its blocks while the prefill
  computes; the prefill pushes the KV when done.
- ``vllm-push``: vLLM's NixlPushConnector protocol (``engines/vllm/push.py``), also concurrent: the decode request
  starts at once naming the prefill engine, and takes the KV once the prefill of the same request id holds it.

TTFT is what a client of the decode sees: from the start of orchestration to the first streamed token. Each
request has a fresh random prompt of exactly that many tokens (no prefix-cache hits), 4 output tokens. Runs are
interleaved (run 1: every length, both arms; then run 2; ...) so a slow moment of the shared machine hits both arms;
each cell prints the median of a run's requests, and the table the range over runs. What the simulator does not
model: SGLang sends KV chunk by chunk during a chunked prefill (here the push follows the whole prefill), and the
HTTP/JSON cost of a real engine's front end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import uuid

import httpx

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.orchestrator import Orchestrator
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster, SimSettings
from litellm_disagg.sim.settings import EngineSettings
from litellm_disagg.sim.tokenizer import VOCAB_SIZE
from litellm_disagg.transfer.prefill import PrefillClient

ARMS = {"sequential": ("vllm", "pull"), "concurrent": ("sglang", "pull"), "vllm-push": ("vllm", "push")}
"""arm -> (simulated engine, vLLM connector)."""


def settings(engine_name: str, speedup: float, max_len: int, kv_transfer: str = "pull") -> SimSettings:
    engine = EngineSettings(num_gpu_blocks=4096, max_model_len=max_len + 64, max_num_batched_tokens=8192)
    return SimSettings(engine=engine, engine_name=engine_name, kv_transfer=kv_transfer).with_speedup(speedup)


async def first_token_s(client: httpx.AsyncClient, orch: Orchestrator, plan: RoutePlan, prompt: list[int]) -> float:
    fields = {"prompt": prompt, "max_tokens": 4, "stream": True}
    request = DisaggRequest(endpoint=Endpoint.COMPLETIONS, fields=fields, request_id=uuid.uuid4().hex)
    started = time.perf_counter()
    outcome = await orch.run(request, plan)
    body = fields | outcome.decode_fields | {"model": plan.decode.model}
    async with client.stream("POST", f"{plan.decode.base_url}/completions", json=body,
                             headers={"X-Request-Id": request.request_id}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if any(c.get("text") for c in chunk.get("choices", [])):
                    return time.perf_counter() - started
    raise RuntimeError("the decode streamed no token")


async def run(args: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    rng = random.Random(args.seed)
    lengths = [int(x) for x in args.lengths.split(",")]
    results: dict[str, dict[int, list[float]]] = {arm: {n: [] for n in lengths} for arm in ARMS}
    clusters, plans = [], {}
    async with httpx.AsyncClient(timeout=120) as client:
        try:
            for arm, (engine_name, kv_transfer) in ARMS.items():
                arm_settings = settings(engine_name, args.speedup, max(lengths), kv_transfer)
                cluster = SimCluster(settings=arm_settings, name=f"bench-{arm}")
                clusters.append(cluster)
                prefill, decode = await cluster.start(prefill=1, decode=1)
                assert prefill.role is WorkerRole.PREFILL and prefill.config and decode.config
                plans[arm] = RoutePlan(decode.config, (prefill.config,), None, "bench")
            orch = Orchestrator(prefill_client=PrefillClient(client=client), accounting=Accounting(),
                                cooldown=FailureCooldown())
            for run_no in range(args.runs):
                for n in lengths:
                    for arm in ARMS:
                        samples = []
                        for _ in range(args.requests):
                            prompt = [rng.randrange(VOCAB_SIZE) for _ in range(n)]
                            samples.append(await first_token_s(client, orch, plans[arm], prompt))
                        median = statistics.median(samples)
                        results[arm][n].append(median)
                        line = f"run {run_no + 1} {n:>6} tokens {arm:<10} TTFT median {median * 1e3:8.1f} ms"
                        print(line, flush=True)
        finally:
            for cluster in clusters:
                await cluster.close()
    return results


def table(results: dict[str, dict[int, list[float]]]) -> str:
    lines = ["| prompt tokens | sequential (vLLM pull) | concurrent (SGLang push) | concurrent (vLLM push) "
             "| SGLang concurrent / sequential | vLLM push / sequential |",
             "|---|---|---|---|---|---|"]

    def span(values: list[float]) -> str:
        return f"{min(values) * 1e3:.0f}-{max(values) * 1e3:.0f} ms"

    for n in results["sequential"]:
        seq, conc, push = results["sequential"][n], results["concurrent"][n], results["vllm-push"][n]
        ratios = [c / s for s, c in zip(seq, conc, strict=True)]
        push_ratios = [c / s for s, c in zip(seq, push, strict=True)]
        lines.append(f"| {n:,} | {span(seq)} | {span(conc)} | {span(push)} | {min(ratios):.2f}-{max(ratios):.2f} "
                     f"| {min(push_ratios):.2f}-{max(push_ratios):.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.orchestration", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="256,1024,4096,7000", help="prompt lengths in tokens (comma-separated)")
    p.add_argument("--requests", type=int, default=6, help="requests per arm, length and run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--speedup", type=float, default=1.0, help="simulated time runs this much faster than real time")
    p.add_argument("--seed", type=int, default=12)
    args = p.parse_args()
    results = asyncio.run(run(args))
    print()
    print(table(results))


if __name__ == "__main__":
    main()
