"""A conversation's second turn with and without the remembered turn's reuse, in one process, arms alternating.

    .venv/bin/python bench/compare_turn_reuse.py [--n 200] [--tokens 8192] [--model-dir DIR]

``tokenizer.reuse_turns`` (``routing/kv/turn_prefix.py``) changes what a next turn costs before the index is asked:
the tokenization and the block hashes. Here two ``KVRouter``\\ s, one with it and one without, get the same
conversations: a first turn (untimed, tokenized in a thread), its answer handed to ``KVRouter.answered`` as the
plugin's success hook does (untimed), then the second turn, timed on both routers in alternating order:
``KVRouter.prompt`` (render, token cache, ids) and the prompt's block hashes for the workers' block size. Both
routers must give the same ids and hashes (checked on every turn). Printed: process CPU time (the tokenizers'
thread pool counts) and wall time, p50 / p99, per arm. The decision that follows (the index walk and the scoring)
is the same code for both and is not timed here; ``bench/micro_routing.py`` times the whole.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import micro_routing as mr  # noqa: E402
from litellm_disagg.engines.base import Endpoint  # noqa: E402
from litellm_disagg.routing.kv.router import KVRouter  # noqa: E402
from litellm_disagg.routing.kv.settings import KVRoutingSettings  # noqa: E402
from litellm_disagg.routing.pool import WorkerPool  # noqa: E402
from litellm_disagg.routing.request import DisaggRequest  # noqa: E402


def p50_p99(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"p50 {statistics.median(values) * 1e6:7.1f} us  p99 {p99 * 1e6:7.1f} us"


async def main(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    configs = mr.workers(8, 1000, args.block_size)
    with tempfile.TemporaryDirectory() as scratch:
        tok_dir = mr.tokenizer_dir(args.model_dir, Path(scratch))
        routers: dict[bool, KVRouter] = {}
        for reuse in (True, False):
            settings = KVRoutingSettings.model_validate(
                {
                    "enabled": True,
                    "seed": 0,
                    "tokenizer": {"model_dirs": {"m": str(tok_dir)}, "http_fallback": False, "reuse_turns": reuse},
                }
            )
            routers[reuse] = KVRouter(settings)
            routers[reuse].sync(WorkerPool.of(configs))
        text = mr.text_of_tokens(tok_dir, args.tokens - 16 - mr.FOLLOW_UP_TOKENS, rng)
        words = mr.bench_words()
        cpu: dict[bool, list[float]] = {True: [], False: []}
        wall: dict[bool, list[float]] = {True: [], False: []}
        warm = 8
        for i in range(-warm, args.n):
            history = [{"role": "user", "content": f"conversation {i}: {text}"}]
            answer = " ".join(rng.choice(words) for _ in range(mr.FOLLOW_UP_TOKENS // 2))
            question = " ".join(rng.choice(words) for _ in range(mr.FOLLOW_UP_TOKENS // 4))
            follow = [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]
            for router in routers.values():
                await router.prompt(DisaggRequest(Endpoint.CHAT, {"messages": history}, request_id=f"a{i}"), configs)
                await router.answered(configs[0].worker_id, {"messages": history}, answer)
            results = {}
            for reuse in (i % 2 == 0, i % 2 != 0):
                request = DisaggRequest(Endpoint.CHAT, {"messages": follow}, request_id=f"b{i}")
                start, start_cpu = time.perf_counter(), time.process_time()
                prompt = await routers[reuse].prompt(request, configs)
                hashes = prompt.hashes(args.block_size) if prompt is not None else None
                if i >= 0:
                    wall[reuse].append(time.perf_counter() - start)
                    cpu[reuse].append(time.process_time() - start_cpu)
                results[reuse] = (None if prompt is None else list(prompt.token_ids), hashes)
            if results[True] != results[False]:
                raise SystemExit(f"conversation {i}: the arms' ids or hashes differ")
        turns = routers[True].tokenizer.turns
        print(
            f"{tok_dir.name} tokenizer, {args.tokens} tokens, {args.n} second turns per arm, block size {args.block_size}"
        )
        print(
            f"  second turn: prompt + block hashes, CPU   reuse {p50_p99(cpu[True])}   no reuse {p50_p99(cpu[False])}"
        )
        print(
            f"  second turn: prompt + block hashes, wall  reuse {p50_p99(wall[True])}   no reuse {p50_p99(wall[False])}"
        )
        print(f"  next turns that started with a remembered one: {turns.stats.hits if turns else 0}")
        for router in routers.values():
            await router.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--model-dir", help="a model directory whose tokenizer and chat template to time")
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
