"""TTFT of vLLM pull vs push on real CPU workers, sequential vs concurrent orchestration, at several prompt lengths.

    flock -x /tmp/ld-cpu.lock .venv/bin/python -m bench.vllm_push [--model DIR] [--lengths 128,512,1500]
                                                                   [--requests 4] [--runs 3]

Two real vLLM prefill/decode pairs on this machine (``litellm-disagg worker``, CPU, NIXL, OMP_NUM_THREADS=1 each):
one with the NixlConnector (``--kv-transfer pull``), one with the NixlPushConnector (``--kv-transfer push``). Arms:

- ``pull``: the router's ``Orchestrator`` with vLLM's pull protocol: prefill, its answer, then the decode, which
  READs the KV from the prefill worker.
- ``push-seq``: the push pair orchestrated sequentially (prefill answered, then the decode request): the decode
  registers its blocks, the prefill WRITEs into them.
- ``push``: the push pair orchestrated as litellm-disagg does (``VllmNixlPushProtocol``, concurrent): the decode is
  sent at once with the prefill engine's published coordinates and registers while the prefill computes.

TTFT is what a client of the decode sees: from the start of orchestration to the first streamed token. Each request
is a fresh random prompt of exactly that many tokens (no prefix-cache hits), 4 output tokens, greedy. Runs are
interleaved (run 1: every length, every arm; then run 2; ...); each cell is the median of a run's requests, the
table the range over runs. Needs the model offline: ``litellm-disagg prepare-model`` (SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.engines import transfer_for
from litellm_disagg.engines.base import Endpoint
from litellm_disagg.processes import kill_tree, spawn, stop
from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.orchestrator import Orchestrator
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole
from litellm_disagg.transfer.prefill import PrefillClient

ARMS = ("pull", "push-seq", "push")
DEFAULT_MODEL = Path.home() / ".cache" / "litellm-disagg" / "models" / "smollm2-135m-instruct"


def start_worker(role: str, transfer: str, model: Path, registry: Path, logs: Path) -> tuple[str, object]:
    worker_id = f"{transfer}-{role}"
    argv = [sys.executable, "-m", "litellm_disagg.cli", "worker", "--role", role, "--model", str(model),
            "--served-model-name", "bench", "--worker-id", worker_id, "--registry-dir", str(registry),
            "--kv-cache-mib", "128", "--max-model-len", "2048", "--kv-transfer", transfer, "--heartbeat-interval", "1",
            "--", "--max-num-seqs", "4"]
    return worker_id, spawn(argv, env=dict(os.environ, OMP_NUM_THREADS="1"), log=logs / f"{worker_id}.log")


async def wait_registered(registry: Path, ids: set[str], timeout_s: float = 900) -> dict[str, RuntimeConfig]:
    deadline = time.monotonic() + timeout_s
    reg = FileRegistry(registry)
    while time.monotonic() < deadline:
        found = {c.worker_id: c for c in await reg.snapshot() if c.worker_id in ids}
        if len(found) == len(ids):
            return found
        await asyncio.sleep(2)
    raise TimeoutError(f"workers not registered: {ids}")


async def stream_first_token(client: httpx.AsyncClient, decode: RuntimeConfig, body: dict, request_id: str) -> None:
    async with client.stream("POST", f"{decode.base_url}/completions", json=body,
                             headers={"X-Request-Id": request_id}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if any(c.get("text") for c in json.loads(line[6:]).get("choices", [])):
                    return
    raise RuntimeError("the decode streamed no token")


async def first_token_s(client: httpx.AsyncClient, orch: Orchestrator, arm: str, plan: RoutePlan,
                        prompt: list[int]) -> float:
    fields = {"prompt": prompt, "max_tokens": 4, "stream": True, "temperature": 0}
    request = DisaggRequest(endpoint=Endpoint.COMPLETIONS, fields=fields, request_id=uuid.uuid4().hex)
    started = time.perf_counter()
    if arm == "push-seq":  # the push protocol's fields, but the decode only once the prefill has answered
        prefill = plan.prefill_order[0]
        protocol = transfer_for(prefill)
        ticket = protocol.open_transfer(prefill=prefill, decode=plan.decode, request_id=request.request_id)
        body = protocol.prefill_body(Endpoint.COMPLETIONS, prefill.model, fields, prefill=prefill, decode=plan.decode,
                                     handle=ticket)
        await orch.prefill_client.prefill(worker=prefill, protocol=protocol, endpoint=Endpoint.COMPLETIONS, body=body,
                                          request_id=request.request_id, handle=ticket)
        decode_fields = protocol.decode_fields(ticket)
    else:
        outcome = await orch.run(request, plan)
        if outcome.prefill_worker_id is None:
            raise RuntimeError(f"{arm}: served aggregated ({outcome.reason})")
        decode_fields = outcome.decode_fields
    await stream_first_token(client, plan.decode, fields | decode_fields | {"model": plan.decode.model},
                             request.request_id)
    return time.perf_counter() - started


async def run(args: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    rng = random.Random(args.seed)
    lengths = [int(x) for x in args.lengths.split(",")]
    results: dict[str, dict[int, list[float]]] = {arm: {n: [] for n in lengths} for arm in ARMS}
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-push-"))
    registry = work / "registry"
    procs = []
    try:
        for transfer in ("pull", "push"):
            for role in ("prefill", "decode"):
                procs.append(start_worker(role, transfer, args.model, registry, work)[1])
        configs = await wait_registered(registry, {f"{t}-{r}" for t in ("pull", "push") for r in ("prefill", "decode")})
        plans = {
            "pull": RoutePlan(configs["pull-decode"], (configs["pull-prefill"],), None, "bench"),
            "push-seq": RoutePlan(configs["push-decode"], (configs["push-prefill"],), None, "bench"),
            "push": RoutePlan(configs["push-decode"], (configs["push-prefill"],), None, "bench"),
        }
        assert configs["push-prefill"].role is WorkerRole.PREFILL
        async with httpx.AsyncClient(timeout=300) as client:
            orch = Orchestrator(prefill_client=PrefillClient(client=client, timeout_s=300), accounting=Accounting(),
                                cooldown=FailureCooldown(), aggregated_fallback=False)
            for arm in ARMS:  # warm-up: first requests pay one-time costs (NIXL handshakes, allocations)
                await first_token_s(client, orch, arm, plans[arm], [rng.randrange(1000, 40000) for _ in range(64)])
            for run_no in range(args.runs):
                for n in lengths:
                    for arm in ARMS:
                        samples = []
                        for _ in range(args.requests):
                            prompt = [rng.randrange(1000, 40000) for _ in range(n)]
                            samples.append(await first_token_s(client, orch, arm, plans[arm], prompt))
                        median = statistics.median(samples)
                        results[arm][n].append(median)
                        print(f"run {run_no + 1} {n:>6} tokens {arm:<9} TTFT median {median * 1e3:8.1f} ms", flush=True)
            await orch.aclose()
    finally:
        for proc in procs:
            kill_tree(proc.pid)
            stop(proc, timeout_s=10)
        print(f"(logs in {work})", flush=True)
    return results


def table(results: dict[str, dict[int, list[float]]]) -> str:
    def cell(values: list[float]) -> str:
        return f"{min(values) * 1e3:.0f}-{max(values) * 1e3:.0f} ms"

    lines = ["| prompt tokens | pull, sequential | push, sequential | push, concurrent | push concurrent / pull |",
             "|---|---|---|---|---|"]
    for n in results["pull"]:
        pull, seq, conc = results["pull"][n], results["push-seq"][n], results["push"][n]
        ratios = [c / p for p, c in zip(pull, conc, strict=True)]
        lines.append(f"| {n:,} | {cell(pull)} | {cell(seq)} | {cell(conc)} | {min(ratios):.2f}-{max(ratios):.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.vllm_push", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--lengths", default="128,512,1500", help="prompt lengths in tokens (comma-separated)")
    p.add_argument("--requests", type=int, default=4, help="requests per arm, length and run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=12)
    args = p.parse_args()
    results = asyncio.run(run(args))
    print()
    print(table(results))


if __name__ == "__main__":
    main()
