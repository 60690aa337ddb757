"""Diagnostic: does a disaggregated decode wait for its engine's next request? (vLLM CPU, NIXL pull, no proxy)

    flock -x /tmp/ld-cpu.lock .venv/bin/python -m bench.decode_stall [--requests 30] [--concurrency 2]
        [--prefill-budget 64] [--switchable] [--tick decode|prefill|none]

One prefill and one decode ``litellm-disagg worker`` (the tiny test Llama) on this machine. Each request is sent the
way the router sends it, straight to the workers: a one-token request with ``do_remote_decode`` to the prefill
worker, then the decode request with the returned ``kv_transfer_params`` to the decode worker, ``--concurrency`` at
a time. Prints the slowest prefill and decode calls, then the decode worker's own counts of requests whose
``vllm:e2e_request_latency_seconds`` or ``request_queue_time_seconds`` exceeded 5 or 10 s (whether the time is
inside vLLM). ``--tick W`` sends a one-token request to worker W every
second meanwhile (an engine step), which is what tells whose idle engine holds a request back; ``--prefill-budget``
passes ``--max-num-batched-tokens`` to the prefill engine. docs/operations.md has what it found.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.ports import free_port
from litellm_disagg.processes import spawn, stop, wait_until

MODEL = "tiny"


def start(run_dir: Path, model_dir: Path, role: str, *, switchable: bool,
          vllm_args: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    argv = [sys.executable, "-m", "litellm_disagg.cli", "worker", "--role", role, "--model", str(model_dir),
            "--served-model-name", MODEL, "--port", str(port), "--worker-id", f"{role}-{port}", "--registry-dir",
            str(run_dir / "registry"), "--kv-cache-mib", "64", "--max-model-len", "1024",
            *(["--switchable"] if switchable else []), "--", "--max-num-seqs", "8", *vllm_args]
    proc = spawn(argv, env=dict(os.environ, OMP_NUM_THREADS="1"), log=run_dir / f"{role}-{port}.log")
    return f"http://127.0.0.1:{port}", proc


def over(url: str, histogram: str, seconds: float) -> int:
    """Requests the worker's own histogram ``vllm:<histogram>`` counts above ``seconds`` (a bucket bound)."""
    buckets = {sample.labels["le"]: sample.value
               for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text)
               for sample in family.samples if sample.name == f"vllm:{histogram}_bucket"}
    return round(buckets["+Inf"] - buckets[str(seconds)])


def registered(run_dir: Path, url: str) -> bool:
    import asyncio

    return any(c.base_url.startswith(url) for c in asyncio.run(FileRegistry(run_dir / "registry").snapshot()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--prefill-budget", type=int, help="the prefill engine's --max-num-batched-tokens")
    parser.add_argument("--switchable", action="store_true", help="both workers --switchable (kv_both)")
    parser.add_argument("--tick", choices=["decode", "prefill", "none"], default="none")
    args = parser.parse_args()

    from litellm_disagg.models.tiny import make_tiny_llama

    model_dir = make_tiny_llama(Path.home() / ".cache" / "litellm-disagg" / "test-models" / "tiny-llama-v1")
    run_dir = Path(tempfile.mkdtemp(prefix="decode-stall-"))
    print(f"logs: {run_dir}", flush=True)
    budget = ["--max-num-batched-tokens", str(args.prefill_budget)] if args.prefill_budget else []
    prefill_url, prefill = start(run_dir, model_dir, "prefill", switchable=args.switchable, vllm_args=budget)
    decode_url, decode = start(run_dir, model_dir, "decode", switchable=args.switchable, vllm_args=[])
    stopping = threading.Event()
    try:
        for url in (prefill_url, decode_url):
            wait_until(lambda url=url: registered(run_dir, url), timeout_s=600, what=f"{url} to register")

        def one(i: int) -> tuple[float, float]:
            prompt = f"Stall probe {i}: " + "the quick brown fox " * 8
            t0 = time.monotonic()
            first = httpx.post(f"{prefill_url}/v1/completions", timeout=120, json={
                "model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                "kv_transfer_params": {"do_remote_decode": True}}).json()
            t1 = time.monotonic()
            httpx.post(f"{decode_url}/v1/completions", timeout=120, json={
                "model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0,
                "kv_transfer_params": first["kv_transfer_params"]}).raise_for_status()
            return t1 - t0, time.monotonic() - t1

        one(-1)  # the pair's first contact (NIXL handshake) is not what is measured

        def tick() -> None:
            url = {"decode": decode_url, "prefill": prefill_url}.get(args.tick)
            while url is not None and not stopping.is_set():
                httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "tick", "max_tokens": 1}, timeout=120)
                stopping.wait(1.0)

        threading.Thread(target=tick, daemon=True).start()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            times = list(pool.map(one, range(args.requests)))
        prefills = sorted(t[0] for t in times)
        decodes = sorted(t[1] for t in times)
        print(f"budget {args.prefill_budget or 'default'}, {'kv_both' if args.switchable else 'producer/consumer'}, "
              f"tick {args.tick}: {args.requests} requests, {args.concurrency} at a time; slowest prefill calls "
              f"{[round(t, 2) for t in prefills[-3:]]} s, slowest decode calls {[round(t, 2) for t in decodes[-4:]]} s, "
              f"median decode {decodes[len(decodes) // 2]:.2f} s, calls over 5 s: prefill "
              f"{sum(t > 5 for t in prefills)}, decode {sum(t > 5 for t in decodes)}", flush=True)
        # Where the time went, by the decode worker's own clock (its arrival to its answer; its queue).
        print(f"decode worker's histograms: e2e latency over 5 s {over(decode_url, 'e2e_request_latency_seconds', 5.0)}, "
              f"over 10 s {over(decode_url, 'e2e_request_latency_seconds', 10.0)}; queue time over 5 s "
              f"{over(decode_url, 'request_queue_time_seconds', 5.0)}", flush=True)
    finally:
        stopping.set()
        for proc in (prefill, decode):
            stop(proc, timeout_s=30)


if __name__ == "__main__":
    main()
