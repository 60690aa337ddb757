"""How soon a released prefill's KV comes back on real vLLM CPU workers (routing/kv_release.py).

    flock -x /tmp/ld-vllm.lock .venv/bin/python -m bench.kv_release_latency [--rounds 3] [--warm] [--steps none]

One prefill worker (``--kv-lease-s 600``: only the release can free its blocks within the run) and one decode worker
(tiny Llama, CPU, NIXL). Each round: a prefill with ``do_remote_decode`` (its blocks are then held for a decode), the
router's release sent through the decode worker, and the time until the prefill worker's ``vllm:kv_cache_usage_perc``
is back to where it was (polled every 0.1 s). ``--warm`` first serves one disaggregated request, so the decode worker
has its NIXL connection to the prefill worker before the first release.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from litellm_disagg.engines.vllm.transfer import KVTransferParams
from litellm_disagg.models.tiny import make_tiny_llama
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.kv_release import KVReleases
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.runtime_config import RuntimeConfig
from litellm_disagg.transfer.prefill import PrefillClient
from tests.support.net import metric
from tests.support.procs import WorkerProc, registered

TEST_MODEL = Path.home() / ".cache" / "litellm-disagg" / "test-models" / "tiny-llama-v1"


def usage(worker: WorkerProc) -> float:
    return metric(worker.url, "vllm:kv_cache_usage_perc")


async def one_round(prefill: WorkerProc, decode: WorkerProc, configs: tuple[RuntimeConfig, RuntimeConfig],
                    index: int, *, steps: tuple[float, ...], timeout_s: float) -> float:
    p_config, d_config = configs
    before = usage(prefill)
    async with httpx.AsyncClient(timeout=120) as client:
        body = {"model": "tiny", "prompt": f"round {index}: " + "def release(n):\n    " * 40, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
        r = await client.post(f"{prefill.url}/v1/completions", json=body)
        r.raise_for_status()
    handle = KVTransferParams.model_validate(r.json()["kv_transfer_params"])
    held_by = time.monotonic() + 60
    while usage(prefill) <= before:
        if time.monotonic() > held_by:
            raise RuntimeError("the prefill's blocks never showed in vllm:kv_cache_usage_perc")
        await asyncio.sleep(0.1)
    sender = PrefillClient()
    pool = WorkerPool.of([p_config, d_config])
    releases = KVReleases(sender=sender, pool=lambda: pool, cooldown=FailureCooldown(), step_delays_s=steps)
    try:
        sent = time.monotonic()
        releases.attempt(f"call-{index}", decode=d_config, prefill=p_config, handle=handle)
        releases.ended(f"call-{index}", worker_id=d_config.worker_id, failed=True)
        while usage(prefill) > before:
            if time.monotonic() - sent > timeout_s:
                return float("inf")
            await asyncio.sleep(0.1)
        return time.monotonic() - sent
    finally:
        await releases.aclose()
        await sender.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--steps", default="0.5,2,5",
                        help="seconds after the release to ask the decode worker for an engine step (KVReleases."
                             "step_delays_s); 'none' for no steps (the behaviour before them)")
    parser.add_argument("--timeout", type=float, default=300, help="give a round up after this many seconds")
    args = parser.parse_args()
    steps = () if args.steps == "none" else tuple(float(x) for x in args.steps.split(","))
    base = Path(tempfile.mkdtemp(prefix="kv-release-"))
    model = make_tiny_llama(TEST_MODEL)
    prefill = WorkerProc("prefill", model, base / "registry", base, wrapper_args=["--kv-lease-s", "600"])
    decode = WorkerProc("decode", model, base / "registry", base)
    try:
        prefill.start()
        decode.start()
        prefill.wait_ready(timeout_s=600)
        decode.wait_ready(timeout_s=600)
        if args.warm:
            body = {"model": "tiny", "prompt": "warm up " * 50, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
            params = httpx.post(f"{prefill.url}/v1/completions", json=body, timeout=120).json()["kv_transfer_params"]
            httpx.post(f"{decode.url}/v1/completions", json=body | {"max_tokens": 2, "kv_transfer_params": params},
                       timeout=120).raise_for_status()
        configs = registered(prefill.registry_dir, prefill.worker_id), registered(decode.registry_dir, decode.worker_id)
        assert configs[0] is not None and configs[1] is not None
        for i in range(args.rounds):
            took = asyncio.run(one_round(prefill, decode, (configs[0], configs[1]), i, steps=steps, timeout_s=args.timeout))
            state = "warm" if args.warm or i else "cold"
            print(f"round {i} ({state} pair, steps {args.steps}): usage back {took:.2f} s after the release", flush=True)
    finally:
        prefill.kill()
        decode.kill()
        print(f"logs: {base}")


if __name__ == "__main__":
    main()
