"""Where the time of KV-aware routing goes: cProfile over the micro-benchmark's workloads (``bench/micro_routing.py``).

    .venv/bin/python bench/profile_routing.py [--top 12] [--what decision,tokenize,ingest]

- ``decision``: an 8k-token prompt's whole decision over 64 workers (hash, one index query, loads, both pools'
  scoring and pick), tokens given, the index holding 1M blocks;
- ``tokenize``: a conversation's second turn tokenized through the token cache (the render of the chat template, the
  split into segments, the cache lookups, the encoding of the new question: the answer before it was cached when it
  completed, as the plugin's success hook does, unless ``--no-answer-hook``), in the calling thread;
- ``ingest``: vLLM-encoded KV event batches (msgpack bytes as on the wire) decoded and applied to the index.

For each, the functions with the most own time (``tottime``) and their share of the profiled total. cProfile adds a
fixed cost per Python call, so functions called very often look heavier than they are; the shares still show where
the work is.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import micro_routing as mr  # noqa: E402
from litellm_disagg.engines.base import Endpoint  # noqa: E402
from litellm_disagg.engines.vllm.kv_events import decode_message  # noqa: E402
from litellm_disagg.routing.kv.block_hash import PromptBlocks  # noqa: E402
from litellm_disagg.routing.kv.event_applier import EventApplier  # noqa: E402
from litellm_disagg.routing.kv.prefix_index import PrefixIndex  # noqa: E402
from litellm_disagg.routing.kv.router import KVRouter  # noqa: E402
from litellm_disagg.routing.kv.settings import KVRoutingSettings  # noqa: E402
from litellm_disagg.routing.kv.tokenizer import encode  # noqa: E402
from litellm_disagg.routing.pool import WorkerPool  # noqa: E402


def report(title: str, fn: Callable[[], None], top: int) -> None:
    fn()  # warm
    profile = cProfile.Profile()
    profile.enable()
    fn()
    profile.disable()
    stats = pstats.Stats(profile)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]  # type: ignore[attr-defined]
    print(f"\n{title}: {total * 1e3:.0f} ms profiled")
    print(f"  {'own %':>6} {'own ms':>8} {'calls':>9}  function")
    for (filename, line, name), (_, calls, tottime, _cum, _) in rows:
        where = f"{Path(filename).name}:{line}" if line else "~"
        print(f"  {100 * tottime / total:6.1f} {tottime * 1e3:8.1f} {calls:9d}  {name} ({where})")


def decision_workload(args: argparse.Namespace) -> Callable[[], None]:
    rng = random.Random(0)
    per_worker = args.blocks // args.workers
    configs = mr.workers(args.workers, per_worker, 16)
    settings = KVRoutingSettings.model_validate({"enabled": True, "seed": 0})
    router = KVRouter(settings)
    router.sync(WorkerPool.of(configs))
    docs = [[rng.randrange(mr.VOCAB) for _ in range(8192 + 512)] for _ in range(64)]
    mr.fill(router.index, configs, docs, per_worker, 16, rng)
    pools = mr.Pools(settings, configs)
    prompts = [d[: 8192 - 7] + [rng.randrange(mr.VOCAB) for _ in range(7)] for d in docs]

    def run() -> None:
        for i in range(args.n):
            ctx = router.context(PromptBlocks(prompts[i % len(prompts)]), configs)
            pools.decode.select(ctx, pools.decode_workers)
            pools.prefill.select(ctx, pools.prefill_workers)

    return run


def tokenize_workload(args: argparse.Namespace, scratch: Path) -> Callable[[], None]:
    rng = random.Random(0)
    tok_dir = mr.tokenizer_dir(None, scratch)
    settings = KVRoutingSettings.model_validate(
        {"enabled": True, "tokenizer": {"model_dirs": {"m": str(tok_dir)}, "http_fallback": False}}
    )
    router = KVRouter(settings)
    loaded = asyncio.run(router.tokenizer._tokenizer("m"))
    assert loaded is not None
    text = mr.text_of_tokens(tok_dir, 8192 - 16 - mr.FOLLOW_UP_TOKENS, rng)
    words = mr.bench_words()
    conversations = []
    for i in range(args.n // 4 + 1):
        history = [{"role": "user", "content": f"conversation {i}: {text}"}]
        answer = " ".join(rng.choice(words) for _ in range(mr.FOLLOW_UP_TOKENS // 2))
        question = " ".join(rng.choice(words) for _ in range(mr.FOLLOW_UP_TOKENS // 4))
        conversations.append((history, history + [{"role": "assistant", "content": answer},
                                                  {"role": "user", "content": question}]))
    for first, second in conversations:  # the first turns: their segments are cached
        encode(loaded.tokenizer, Endpoint.CHAT, {"messages": first}, segments=loaded.segments)
        if not args.no_answer_hook:  # and their answers', as the plugin's success hook caches them (remember_answer)
            answered = loaded.tokenizer.apply_chat_template(second[:-1], tokenize=False, add_generation_prompt=False)
            loaded.segments.remember(answered)
    turn = iter(range(10**9))

    def run() -> None:
        for _ in range(args.n // 4):
            _, second = conversations[next(turn) % len(conversations)]
            encode(loaded.tokenizer, Endpoint.CHAT, {"messages": second}, segments=loaded.segments)

    return run


def ingest_workload(args: argparse.Namespace) -> Callable[[], None]:
    rng = random.Random(1)
    per_worker = max(1024, args.ingest_blocks // args.workers)
    stream = mr.synthetic_stream(args.workers, 16, per_worker, rng)

    def run() -> None:
        index = PrefixIndex()
        for wid, messages in stream.items():
            index.add_worker(wid, capacity_blocks=per_worker)
            applier = EventApplier(wid, index, block_size=16, capacity_blocks=per_worker)
            for frames in messages:
                applier.apply(decode_message(frames))

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--ingest-blocks", type=int, default=300_000)
    parser.add_argument("--n", type=int, default=400, help="decisions profiled (a quarter as many tokenizations)")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--what", default="decision,tokenize,ingest")
    parser.add_argument(
        "--no-answer-hook", action="store_true", help="tokenize: the first turns' answers are not cached beforehand"
    )
    args = parser.parse_args()
    what = set(args.what.split(","))
    if "decision" in what:
        report(f"decision, 8k tokens, {args.workers} workers, x{args.n}", decision_workload(args), args.top)
    if "tokenize" in what:
        with tempfile.TemporaryDirectory() as scratch:
            report(f"tokenize 2nd turn, 8k tokens, x{args.n // 4}", tokenize_workload(args, Path(scratch)), args.top)
    if "ingest" in what:
        report("ingest: decode + apply", ingest_workload(args), args.top)


if __name__ == "__main__":
    main()
