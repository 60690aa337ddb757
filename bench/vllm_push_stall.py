"""Reproduce the vLLM push stall (docs/benchmarks.md, "vLLM pull vs push on real CPU workers"): one real vLLM CPU
prefill/decode pair started with ``--kv-transfer push`` behind the real LiteLLM proxy (the shipped config, every
prompt prefilled remotely), chats one at a time and then 16 at once, each with a 60 s client timeout.

    flock -x /tmp/ld-vllm.lock .venv/bin/python -m bench.vllm_push_stall --sequential 12 --concurrent 16 [--debug] [--tick 1]

Prints one line per request: index, ``ok`` or the client's error, seconds. ``--debug`` starts the workers with
``VLLM_LOGGING_LEVEL=DEBUG`` (their logs, with the proxy's, stay in ``--out``). Needs the test model
(``tests/conftest.py``'s tiny Llama, made on first use).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai

from litellm_disagg.models.tiny import make_tiny_llama
from tests.support.procs import MASTER_KEY, ProxyProc, WorkerProc
from tests.support.proxy_configs import shipped_with_remote_prefill

TEST_MODEL = Path.home() / ".cache" / "litellm-disagg" / "test-models" / "tiny-llama-v1"
PUSH = ["--kv-transfer", "push"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=12)
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for both workers (e.g. LITELLM_DISAGG_NIXL_PROGRESS_DELAY_US=0)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tick", type=float, default=0.0, metavar="S",
                        help="every S seconds, a one-token request straight to the decode worker (one engine step), "
                             "to test whether the stall is an idle decode engine waiting for a step; 0: off")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="vllm-push-stall-"))
    out.mkdir(parents=True, exist_ok=True)
    model = make_tiny_llama(TEST_MODEL)
    registry = out / "registry"
    env = {"VLLM_LOGGING_LEVEL": "DEBUG"} if args.debug else {}
    env |= dict(item.split("=", 1) for item in args.worker_env)
    prefill = WorkerProc("prefill", model, registry, out, wrapper_args=PUSH, env=env)
    decode = WorkerProc("decode", model, registry, out, wrapper_args=PUSH, env=env)
    proxy = ProxyProc(registry, out, config=shipped_with_remote_prefill(out, model="tiny", model_dir=model))
    print(f"logs: {out}", flush=True)
    try:
        prefill.start()
        decode.start()
        proxy.start()
        prefill.wait_ready(timeout_s=600)
        decode.wait_ready(timeout_s=600)
        proxy.wait_ready("tiny", timeout_s=300)
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=MASTER_KEY, max_retries=0, timeout=args.timeout)

        def ask(i: int) -> str:
            started = time.monotonic()
            messages = [{"role": "user", "content": f"Request {i} about pushing KV caches. " * (5 + i % 13)}]
            try:
                if i % 2:
                    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16,
                                                            temperature=0, stream=True)
                    "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                else:
                    client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
                outcome = "ok"
            except Exception as exc:  # the client's error is the result
                outcome = type(exc).__name__
            return f"{time.strftime('%H:%M:%S')} request {i}: {outcome} {time.monotonic() - started:.1f} s"

        done = threading.Event()

        def tick() -> None:
            while not done.wait(args.tick):
                try:
                    httpx.post(f"{decode.url}/v1/completions", json={"model": "tiny", "prompt": [0], "max_tokens": 1},
                               timeout=args.timeout)
                except httpx.HTTPError:
                    pass

        ticker = threading.Thread(target=tick, daemon=True)
        if args.tick > 0:
            ticker.start()
        for i in range(args.sequential):
            print("one at a time:", ask(i), flush=True)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for line in pool.map(ask, range(100, 100 + args.concurrent)):
                print("concurrent:", line, flush=True)
        done.set()
    finally:
        proxy.stop()
        prefill.kill()
        decode.kill()


if __name__ == "__main__":
    main()
