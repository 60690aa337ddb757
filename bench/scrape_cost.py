"""``python -m bench.scrape_cost``: what one load scrape costs a real vLLM CPU worker's API server process.

Starts one vLLM CPU worker (SmolLM2, as ``bench.serving --backend vllm`` does), serves one request so the counters
exist, then fetches its ``/metrics`` page ``--scrapes`` times per round, whole and with the load scraper's sample
names as ``prometheus_client``'s ``name[]`` filter, and prints the API server process's CPU per scrape (``psutil``,
user + system) and both pages' sizes. docs/operations.md quotes it.

    .venv/bin/python -m bench.scrape_cost [--scrapes 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from urllib.parse import urlencode

import httpx
import psutil

from bench.serving.workers import start_vllm
from litellm_disagg.engines.vllm.metrics import VLLM_METRICS
from litellm_disagg.models.smollm2 import prepare_smollm2
from litellm_disagg.routing.kv.load_scraper import _LoadNames


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.scrape_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scrapes", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    names = _LoadNames.of(VLLM_METRICS).wanted.names
    query = urlencode([("name[]", n) for n in names])
    workers = start_vllm(Path(tempfile.mkdtemp(prefix="scrape-cost-")), count=1, model_dir=str(prepare_smollm2()),
                         served="smollm2", kv_cache_mib=1024, max_model_len=4096)
    try:
        url = workers.workers[0].server_url
        httpx.post(f"{url}/v1/completions", json={"model": "smollm2", "prompt": "hello " * 50, "max_tokens": 8},
                   timeout=300).raise_for_status()
        root = psutil.Process(workers.procs[0].pid)
        server = next(c for c in root.children(recursive=True) if "api_server" in " ".join(c.cmdline()))

        def cpu_s() -> float:
            t = server.cpu_times()
            return t.user + t.system

        pages = {"whole": f"{url}/metrics", "name[] filter": f"{url}/metrics?{query}"}
        with httpx.Client(timeout=60) as client:
            for label, page in pages.items():
                print(f"{label}: {len(client.get(page).content):,} bytes")
            for r in range(args.rounds):
                for label, page in pages.items():
                    before = cpu_s()
                    for _ in range(args.scrapes):
                        client.get(page)
                    print(f"round {r + 1}, {label}: {1000 * (cpu_s() - before) / args.scrapes:.2f} ms of the API "
                          f"server's CPU per scrape", flush=True)
    finally:
        workers.close()


if __name__ == "__main__":
    main()
