"""Pure Python against the compiled KV routing core, in one process, alternating call by call over the same index.

    .venv/bin/python bench/compare_native.py [--n 1000] [--ingest-blocks 300000]

The micro-benchmark (``bench/micro_routing.py``) runs one arm per process; on a busy shared machine two processes
minutes apart see different loads. Here both arms share the process, the 1M-block index (64 workers, 8k-token
prompts, as there) and the moment: each iteration times the same step once pure (the module-level handles of the
compiled core set to None) and once compiled, in alternating order. Printed: CPU time (``thread_time``) p50 / p99 per
arm for the block hashes, the prefix lookup and the whole decision of both pools (tokens given), and the best of
alternating runs of the KV-event apply step (hash rebuild, translation, index) on fresh indexes.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import micro_routing as mr  # noqa: E402
from litellm_disagg.engines.vllm.kv_events import decode_message  # noqa: E402
from litellm_disagg.routing.kv import block_hash, native, prefix_index  # noqa: E402
from litellm_disagg.routing.kv.block_hash import PromptBlocks, chain_hashes  # noqa: E402
from litellm_disagg.routing.kv.event_applier import EventApplier  # noqa: E402
from litellm_disagg.routing.kv.prefix_index import PrefixIndex  # noqa: E402
from litellm_disagg.routing.kv.router import KVRouter  # noqa: E402
from litellm_disagg.routing.kv.settings import KVRoutingSettings  # noqa: E402
from litellm_disagg.routing.pool import WorkerPool  # noqa: E402


def arm(compiled: bool) -> None:
    core = native.core if compiled else None
    block_hash._native = core  # type: ignore[attr-defined]
    prefix_index._native = core  # type: ignore[attr-defined]


def p50_p99(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"p50 {statistics.median(values) * 1e6:7.1f} us  p99 {p99 * 1e6:7.1f} us"


def paired(label: str, fn: Callable[[int], object], n: int) -> None:
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for i in range(n):
        for compiled in (i % 2 == 0, i % 2 != 0):
            arm(compiled)
            start = time.thread_time()
            fn(i)
            cpu[compiled].append(time.thread_time() - start)
    print(f"  {label:<34} pure {p50_p99(cpu[False])}   compiled {p50_p99(cpu[True])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--ingest-blocks", type=int, default=300_000)
    args = parser.parse_args()
    if not native.NATIVE:
        sys.exit(f"compiled core not in use: {native.WHY}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    rng = random.Random(0)
    per_worker = args.blocks // args.workers
    configs = mr.workers(args.workers, per_worker, 16)
    settings = KVRoutingSettings.model_validate({"enabled": True, "seed": 0})
    router = KVRouter(settings)
    router.sync(WorkerPool.of(configs))
    docs = [[rng.randrange(mr.VOCAB) for _ in range(8192 + 512)] for _ in range(64)]
    arm(True)
    mr.fill(router.index, configs, docs, per_worker, 16, rng)
    pools = mr.Pools(settings, configs)
    prompts = [d[: 8192 - 7] + [rng.randrange(mr.VOCAB) for _ in range(7)] for d in docs]
    hashes = [chain_hashes(p, 16) for p in prompts]
    gc.collect()
    print(f"8k-token prompts, {args.workers} workers, {router.index.stats().held_blocks:,} blocks indexed (CPU time)")

    def decide(i: int) -> None:
        ctx = router.context(PromptBlocks(prompts[i % len(prompts)]), configs)
        pools.decode.select(ctx, pools.decode_workers)
        pools.prefill.select(ctx, pools.prefill_workers)

    paired("block hashes", lambda i: chain_hashes(prompts[i % len(prompts)], 16), args.n)
    paired("prefix lookup", lambda i: router.index.overlap(hashes[i % len(hashes)]), args.n)
    paired("decision, both pools", decide, args.n)

    stream = mr.synthetic_stream(args.workers, 16, max(1024, args.ingest_blocks // args.workers), random.Random(1))
    per = max(1024, args.ingest_blocks // args.workers)
    total = sum(mr.count_blocks(m) for m in stream.values())
    decoded = {wid: [decode_message(f) for f in messages] for wid, messages in stream.items()}
    best: dict[bool, float] = {False: float("inf"), True: float("inf")}
    for compiled in (False, True, True, False, False, True):
        arm(compiled)
        index = PrefixIndex()
        appliers = {}
        for wid in decoded:
            index.add_worker(wid, capacity_blocks=per)
            appliers[wid] = EventApplier(wid, index, block_size=16, capacity_blocks=per)
        gc.collect()
        start = time.thread_time()
        for wid, batches in decoded.items():
            for batch in batches:
                appliers[wid].apply(batch)
        best[compiled] = min(best[compiled], time.thread_time() - start)
    print(
        f"  {'apply (M block events/s, CPU)':<34} pure {total / best[False] / 1e6:5.2f}"
        f"   compiled {total / best[True] / 1e6:5.2f}   ({total:,} block events, best of 3 each)"
    )
    arm(True)


if __name__ == "__main__":
    main()
