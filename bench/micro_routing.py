"""Micro-benchmark of KV-aware routing: decision latency and KV-event ingestion rate. Prints its figures.

    .venv/bin/python bench/micro_routing.py [--workers 64] [--blocks 1000000] [--block-size 16] [--model-dir DIR]

What it measures (p50 / p99 over many decisions, one process, no network):

- ``hash``: chained block hashes of the prompt's token ids;
- ``lookup``: one prefix-index query (``PrefixIndex.overlap``) over 64 workers holding 1M blocks in all;
- ``decision``: hash + one lookup + load snapshot + scoring + selection for the decode pool and the prefill pool
  (``KVRouter.context`` over all 64 workers, then the decode and the prefill profile's ``Pipeline.select``, as the
  route planner runs them), tokenization excluded; ``prefill``: the same for the prefill pool alone;
- ``tokenize 1st turn``: a new conversation's first request (every prompt distinct: nothing cached), tokenized with
  the model's tokenizer and chat template in a thread (``KVRouter.prompt``); ``tokenize 2nd turn``: the same
  conversation's next request (its first turn's messages, an answer and a short follow-up), whose earlier messages
  come from the token cache, and the answer's too when the plugin's success hook cached it as the answer completed
  (``KVRouter.answered``, called between the turns, untimed; ``--no-answer-hook`` leaves it out); each also as
  ``+decision`` (tokenize, then the decision above for both pools, the index holding the first turn's blocks on a
  few workers as their KV events would report); ``--turns`` conversations per prompt size (300: a p99 over fewer is
  close to the maximum). With ``--model-dir`` that model's tokenizer; else the tiny test model if it is on disk, else
  a small BPE built here.

Latencies are wall-clock; ``cpu`` is the CPU time of the same calls (the calling thread's; with tokenization, which
runs in a worker thread, the whole process's), which leaves out the time other processes take the cores: on a
shared machine, most of the wall-clock p99.

Ingestion: vLLM-encoded KV event batches (msgpack bytes, as on the wire) for the same workers, measured as
``decode+apply`` (``decode_message`` + ``EventApplier.apply``: hash rebuild, translation, index update),
``compiled decode+apply`` (``_kvwire.apply_message``: the same from the bytes in one call, when built), ``apply``
(already decoded batches), ``index only`` (``PrefixIndex.stored``/``removed`` on ready hashes), and over a real ZMQ
PUB -> SUB pair on 127.0.0.1 (``KVEventSubscriber``, which takes the compiled path when built). Rates are block
events per second (each stored or removed block counts one). ``--skip-decisions`` runs the ingestion part alone.

Figures depend on the machine and on what else runs on it: compare runs on one machine. The compiled core of KV
routing (``scripts/build_native.sh``) is used when built; ``LITELLM_DISAGG_PURE_PYTHON=1`` runs the pure-Python paths
(the first line printed says which).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from litellm_disagg.engines.base import BlockRemoved, BlockStored, Endpoint  # noqa: E402
from litellm_disagg.engines.vllm import VLLM  # noqa: E402
from litellm_disagg.engines.vllm.kv_events import decode_message  # noqa: E402
from litellm_disagg.routing.accounting import FlightKey  # noqa: E402
from litellm_disagg.routing.kv.block_hash import ROOT, PromptBlocks, chain_hashes  # noqa: E402
from litellm_disagg.routing.kv.event_applier import EventApplier  # noqa: E402
from litellm_disagg.routing.kv.event_subscriber import compiled_path  # noqa: E402
from litellm_disagg.routing.kv.prefix_index import PrefixIndex  # noqa: E402
from litellm_disagg.routing.kv.router import KVRouter  # noqa: E402
from litellm_disagg.routing.kv.settings import KVRoutingSettings  # noqa: E402
from litellm_disagg.routing.pipeline.pipeline import Pipeline  # noqa: E402
from litellm_disagg.routing.pipeline.selection import Selection  # noqa: E402
from litellm_disagg.routing.pool import WorkerPool  # noqa: E402
from litellm_disagg.routing.request import DisaggRequest  # noqa: E402
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole, WorkerState  # noqa: E402

FOLLOW_UP_TOKENS = 160
"""About how many tokens a second turn adds (an answer and a question)."""
TINY_MODEL = Path.home() / ".cache" / "litellm-disagg" / "test-models" / "tiny-llama-v1"
VOCAB = 32_000


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def percentiles(samples: list[float], cpu: list[float] | None = None) -> str:
    def p50_p99(values: list[float]) -> tuple[float, float]:
        values = sorted(values)
        return statistics.median(values), values[min(len(values) - 1, int(len(values) * 0.99))]

    p50, p99 = p50_p99(samples)
    out = f"p50 {p50 * 1e6:8.1f} us   p99 {p99 * 1e6:8.1f} us"
    if cpu:
        cpu50, cpu99 = p50_p99(cpu)
        out += f"   cpu p50 {cpu50 * 1e6:7.1f} p99 {cpu99 * 1e6:7.1f}"
    return out


class Timed:
    """Wall-clock and CPU time of each call."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __str__(self) -> str:
        return percentiles(self.wall, self.cpu)


def timed(fn: Callable[[], object], n: int) -> Timed:
    fn()
    out = Timed()
    for _ in range(n):
        start, start_cpu = time.perf_counter(), time.thread_time()
        fn()
        out.cpu.append(time.thread_time() - start_cpu)
        out.wall.append(time.perf_counter() - start)
    return out


# -- the cluster -------------------------------------------------------------------------------------------------------


def workers(n: int, capacity: int, block_size: int) -> list[RuntimeConfig]:
    out = []
    for i in range(n):
        role = WorkerRole.PREFILL if i < n // 2 else WorkerRole.DECODE
        out.append(
            RuntimeConfig(
                worker_id=f"w{i:02d}",
                model="m",
                role=role,
                base_url=f"http://127.0.0.1:{20000 + i}/v1",
                transfer=VllmNixlTransfer(host="127.0.0.1", port=5600),
                kv_capacity_blocks=capacity,
                block_size=block_size,
                kv_events_endpoint=f"tcp://127.0.0.1:{30000 + i}",
                state=WorkerState.READY,
            )
        )
    return out


def fill(
    index: PrefixIndex,
    configs: list[RuntimeConfig],
    docs: list[list[int]],
    per_worker: int,
    block_size: int,
    rng: random.Random,
) -> None:
    """Each worker holds a few shared documents' prefixes (what prompts will hit) and unique blocks to capacity."""
    doc_hashes = [chain_hashes(d, block_size) for d in docs]
    for w in configs:
        for d in rng.sample(range(len(docs)), min(8, len(docs))):
            index.stored(w.worker_id, doc_hashes[d][: rng.randrange(len(doc_hashes[d]) // 8, len(doc_hashes[d]))])
        while (missing := per_worker - index.blocks(w.worker_id)) > 0:
            tokens = [rng.randrange(VOCAB) for _ in range(block_size * min(256, missing))]
            index.stored(w.worker_id, chain_hashes(tokens, block_size))


# -- tokenizer ---------------------------------------------------------------------------------------------------------


def tokenizer_dir(arg: str | None, scratch: Path) -> Path:
    if arg:
        return Path(arg)
    if (TINY_MODEL / "tokenizer.json").is_file():
        return TINY_MODEL
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [p.read_text(errors="ignore") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:80]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainer=trainers.BpeTrainer(
            vocab_size=4096,
            special_tokens=["<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    out = scratch / "bpe"
    fast.save_pretrained(out)
    return out


def bench_words() -> list[str]:
    return [w for w in Path(__file__).read_text().split() if w.isalpha()] or ["routing"]


def text_of_tokens(directory: Path, target: int, rng: random.Random) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    words = bench_words()
    text = ""
    while len(tok(text, add_special_tokens=False)["input_ids"]) < target:
        text += " ".join(rng.choice(words) for _ in range(max(16, (target - len(text) // 4) // 2))) + "\n"
    ids = tok(text, add_special_tokens=False)["input_ids"][:target]
    return str(tok.decode(ids))


# -- decisions ---------------------------------------------------------------------------------------------------------


class Pools:
    """The decode and the prefill pool's pipelines, built as the controller builds them (one RNG, seeded from the
    settings), each with its worker candidates."""

    def __init__(self, settings: KVRoutingSettings, configs: list[RuntimeConfig]):
        rng = random.Random(settings.seed)
        self.decode = Pipeline(settings.decode, rng=rng)
        self.prefill = Pipeline(settings.prefill, rng=rng)
        self.decode_workers = [w for w in configs if w.role is WorkerRole.DECODE]
        self.prefill_workers = [w for w in configs if w.role is WorkerRole.PREFILL]


async def bench_decisions(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    per_worker = args.blocks // args.workers
    configs = workers(args.workers, per_worker, args.block_size)
    settings = KVRoutingSettings.model_validate({"enabled": True, "seed": 0})
    with tempfile.TemporaryDirectory() as scratch:
        tok_dir = tokenizer_dir(args.model_dir, Path(scratch))
        settings = settings.model_copy(
            # Tokenization is local only: no worker listens here, so none is asked for its /tokenize.
            update={
                "tokenizer": settings.tokenizer.model_copy(
                    update={"model_dirs": {"m": str(tok_dir)}, "http_fallback": False}
                    | ({"inline_max_new_chars": 0} if args.tokenize_in_thread else {})
                    | ({"reuse_turns": False} if args.no_turn_reuse else {})
                )
            }
        )
        router = KVRouter(settings)
        router.sync(WorkerPool.of(configs))  # event subscribers are created, not started: no sockets connect
        docs = [[rng.randrange(VOCAB) for _ in range(8192 + 512)] for _ in range(64)]
        before = rss_mb()
        started = time.perf_counter()
        fill(router.index, configs, docs, per_worker, args.block_size, rng)
        stats = router.index.stats()
        print(
            f"index: {stats.workers} workers, {stats.held_blocks:,} blocks held ({stats.distinct_blocks:,} distinct), "
            f"filled in {time.perf_counter() - started:.1f} s, +{rss_mb() - before:.0f} MB RSS"
        )
        for w in configs[::3]:  # some load, so that the load terms are not all zero
            router.accounting.start(
                FlightKey.decode(f"r-{w.worker_id}"),
                w.worker_id,
                prefill_tokens=rng.randrange(0, 4096),
                decode_blocks=rng.randrange(0, 500),
            )
        pools = Pools(settings, configs)
        gc.collect()
        print(f"\ndecision latency, {args.workers} workers, block size {args.block_size}")
        for size in (1024, 8192):
            n = args.iterations if size == 1024 else max(200, args.iterations // 4)
            prompts = [d[: size - 7] + [rng.randrange(VOCAB) for _ in range(7)] for d in docs]
            decisions(router, pools, configs, prompts, args.block_size, n)
            await tokenized_decisions(
                router, pools, configs, tok_dir, size, args.turns, rng, args.no_answer_hook, args.novel_words
            )
        await router.stop()


def decisions(
    router: KVRouter, pools: Pools, configs: list[RuntimeConfig], prompts: list[list[int]], block_size: int, n: int
) -> None:
    """Hash, lookup, and whole decisions (tokens given), ``n`` times each over the prompts in turn."""
    prefill, decode = pools.prefill_workers, pools.decode_workers
    turn = iter(range(10**9))
    hashes = [chain_hashes(p, block_size) for p in prompts]

    def one_prompt() -> list[int]:
        return prompts[next(turn) % len(prompts)]

    def decide() -> None:
        blocks = PromptBlocks(one_prompt())
        ctx = router.context(blocks, configs)  # one index query and the loads of both pools
        pools.decode.select(ctx, decode)
        pools.prefill.select(ctx, prefill)

    def select_prefill(blocks: PromptBlocks) -> Selection:
        return pools.prefill.select(router.context(blocks, prefill), prefill)

    t_hash = timed(lambda: chain_hashes(one_prompt(), block_size), n)
    t_lookup = timed(lambda: router.index.overlap(hashes[next(turn) % len(hashes)]), n)
    t_decision = timed(decide, n)
    t_prefill = timed(lambda: select_prefill(PromptBlocks(one_prompt())), n)
    sample = select_prefill(PromptBlocks(prompts[0]))
    best = max(b.cached_tokens for b in sample.breakdown.values())
    size = len(prompts[0])
    print(f"  {size:>5} tokens  hash      {t_hash}")
    print(f"  {size:>5} tokens  lookup    {t_lookup}   (best overlap {best} tokens)")
    print(f"  {size:>5} tokens  decision  {t_decision}   (hash + lookup + scoring both pools)")
    print(f"  {size:>5} tokens  prefill   {t_prefill}   (hash + lookup + scoring the prefill pool)")


async def tokenized_decisions(
    router: KVRouter,
    pools: Pools,
    configs: list[RuntimeConfig],
    tok_dir: Path,
    size: int,
    n: int,
    rng: random.Random,
    no_answer_hook: bool = False,
    novel_words: int = 0,
) -> None:
    """Conversations of about ``size`` tokens: each one's first turn (nothing cached) and second turn (its earlier
    messages cached), tokenization alone and followed by the decision for both pools."""
    prefill, decode = pools.prefill_workers, pools.decode_workers
    words = bench_words()
    text = text_of_tokens(tok_dir, size - 16 - FOLLOW_UP_TOKENS, rng)

    def chat(i: int, messages: list[dict[str, str]]) -> DisaggRequest:
        return DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": messages}, request_id=f"r{i}")

    def decide(prompt: PromptBlocks | None) -> None:
        ctx = router.context(prompt, configs)
        pools.decode.select(ctx, decode)
        pools.prefill.select(ctx, prefill)

    async def turn(request: DisaggRequest, tok: Timed, both: Timed) -> PromptBlocks | None:
        start, start_cpu = time.perf_counter(), time.process_time()
        prompt = await router.prompt(request, decode)  # the model's local tokenizer
        mid, mid_cpu = time.perf_counter(), time.process_time()
        decide(prompt)
        both.wall.append(time.perf_counter() - start)
        both.cpu.append(time.process_time() - start_cpu)
        tok.wall.append(mid - start)
        tok.cpu.append(mid_cpu - start_cpu)
        return prompt

    cache = getattr(router.tokenizer, "token_cache", None)  # None: no token cache (or code from before it)
    # The answer's segments cached when it completes (``KVRouter.answered``, the plugin's success hook); absent in
    # code from before it, or turned off with --no-answer-hook.
    remember = None if no_answer_hook else getattr(router, "answered", None)
    answered = 0
    warm = 8  # the first multi-segment prompts of a tokenizer are also encoded whole, as a check: not timed
    first_tok, first_all, second_tok, second_all = Timed(), Timed(), Timed(), Timed()
    hits_before = (cache.stats.hit_tokens, cache.stats.hits, cache.stats.misses) if cache else (0, 0, 0)
    tokens_first = tokens_second = 0
    for i in range(-warm, n):
        # The first turn: one long user message (distinct per conversation) and the generation prompt.
        history = [{"role": "user", "content": f"conversation {i}: {text}"}]
        first = await turn(chat(i, history), Timed() if i < 0 else first_tok, Timed() if i < 0 else first_all)
        if first is not None:  # the engines that served it now hold its blocks
            for worker in rng.sample(prefill, 2) + rng.sample(decode, 1):
                router.index.stored(worker.worker_id, first.hashes(worker.block_size))
        # The second turn: the first one's messages, the answer, a follow-up question.
        answer = " ".join(rng.choice(words) for _ in range(FOLLOW_UP_TOKENS // 2))
        question = " ".join(rng.choice(words) for _ in range(FOLLOW_UP_TOKENS // 4))
        for _ in range(novel_words):  # a word no earlier prompt had (--novel-words): not in any cache
            question += " " + "".join(rng.choice(string.ascii_lowercase) for _ in range(9))
        if remember is not None:  # the plugin's success hook, when the answer completes (not timed)
            answered += await remember(decode[0].worker_id, {"messages": history}, answer) > 0
        follow_up = history + [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]
        second = await turn(chat(i, follow_up), Timed() if i < 0 else second_tok, Timed() if i < 0 else second_all)
        if i == 0:
            tokens_first = first.num_tokens if first else 0
            tokens_second = second.num_tokens if second else 0
        if i == -1 and cache is not None:
            hits_before = (cache.stats.hit_tokens, cache.stats.hits, cache.stats.misses)
    label = f"{tok_dir.name} tokenizer, in a thread"
    print(f"  {size:>5} tokens  tokenize 1st turn            {first_tok}   ({tokens_first} tokens, {label})")
    print(f"  {size:>5} tokens  tokenize 1st turn + decision {first_all}")
    print(
        f"  {size:>5} tokens  tokenize 2nd turn            {second_tok}   ({tokens_second} tokens, earlier turn cached)"
    )
    print(f"  {size:>5} tokens  tokenize 2nd turn + decision {second_all}")
    print(f"  {'':>5}         tokenized on the event loop: {router.tokenizer.inline_encodes} prompts in all")
    print(
        f"  {'':>5}         question: {FOLLOW_UP_TOKENS // 4} words of the benchmark's list + {novel_words} never seen"
    )
    hook = "off" if remember is None else f"{answered} of {n + warm} answers cached when they completed"
    print(f"  {'':>5}         answer hook: {hook}")
    turns = getattr(router.tokenizer, "turns", None)  # absent in code from before turn reuse
    reuse = "off" if turns is None else f"{turns.stats.hits} next turns started with a remembered one"
    print(f"  {'':>5}         turn reuse: {reuse}")
    if cache is not None:
        hit_tokens, hits, misses = (
            cache.stats.hit_tokens - hits_before[0],
            cache.stats.hits - hits_before[1],
            cache.stats.misses - hits_before[2],
        )
        print(
            f"  {'':>5}         token cache: {hits} segment hits ({hit_tokens} tokens), {misses} misses; "
            f"{cache.tokens:,} tokens cached in {len(cache)} segments"
        )
    else:
        print(f"  {'':>5}         token cache: off")


# -- ingestion ---------------------------------------------------------------------------------------------------------


def synthetic_stream(
    n_workers: int, block_size: int, blocks_per_worker: int, rng: random.Random, first_seq: int = 0
) -> dict[str, list[list[bytes]]]:
    """Per worker, vLLM-encoded messages: requests of 64 blocks stored in chained 16-block events (prefill chunks),
    and evictions of the oldest blocks once the cache is full (BlockRemoved, 8 blocks per event)."""
    out: dict[str, list[list[bytes]]] = {}
    for w in range(n_workers):
        messages: list[list[bytes]] = []
        cached: list[int] = []
        stored = 0
        seq = first_seq
        salt = rng.getrandbits(60)
        while stored < blocks_per_worker:
            tokens = [rng.randrange(VOCAB) for _ in range(64 * block_size)]
            engine = [hash((salt, stored + i)) & (2**64 - 1) for i in range(64)]
            events = []
            for chunk in range(4):
                lo, hi = chunk * 16, (chunk + 1) * 16
                events.append(
                    {
                        "type": "BlockStored",
                        "block_hashes": engine[lo:hi],
                        "parent_block_hash": engine[lo - 1] if lo else None,
                        "token_ids": tokens[lo * block_size : hi * block_size],
                        "block_size": block_size,
                        "lora_id": None,
                        "medium": "GPU",
                        "lora_name": None,
                        "group_idx": 0,
                    }
                )
            cached += engine
            stored += 64
            while len(cached) > blocks_per_worker // 2:
                gone, cached = cached[:8], cached[8:]
                events.append({"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU", "group_idx": 0})
            for event in events:  # one event per batch, as a busy engine step often sends
                messages.append([b"kv", seq.to_bytes(8, "big"), msgpack.packb([time.time(), [event], 0])])
                seq += 1
        out[f"w{w:02d}"] = messages
    return out


def count_blocks(messages: list[list[bytes]]) -> int:
    return sum(len(e.get("block_hashes", ())) for m in messages for e in msgpack.unpackb(m[2])[1])


async def bench_ingestion(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed + 1)
    per_worker = max(1024, args.ingest_blocks // args.workers)
    stream = synthetic_stream(args.workers, args.block_size, per_worker, rng)
    total_blocks = sum(count_blocks(m) for m in stream.values())
    total_messages = sum(len(m) for m in stream.values())
    print(
        f"\nKV event ingestion: {total_messages:,} batches, {total_blocks:,} block events over {args.workers} workers"
    )

    def fresh() -> tuple[PrefixIndex, dict[str, EventApplier]]:
        index = PrefixIndex()
        appliers = {}
        for wid in stream:
            index.add_worker(wid, capacity_blocks=per_worker)
            appliers[wid] = EventApplier(wid, index, block_size=args.block_size, capacity_blocks=per_worker)
        return index, appliers

    def rate(label: str, run: Callable[[], None]) -> None:
        """Best and median of ``args.repeats`` runs (other processes on the machine only ever slow a run down)."""
        times = []
        for _ in range(args.repeats):
            gc.collect()
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        best, median = min(times), statistics.median(times)
        best_rate, median_rate = total_blocks / best / 1e6, total_blocks / median / 1e6
        print(f"  {label:<46} best {best_rate:5.2f}  median {median_rate:5.2f}  M block events/s")

    def decode_and_apply() -> None:
        _, appliers = fresh()
        for wid, messages in stream.items():
            applier = appliers[wid]
            for frames in messages:
                applier.apply(decode_message(frames))
        assert sum(a.stats.skipped_blocks for a in appliers.values()) == 0

    def compiled_decode_and_apply() -> None:
        _, appliers = fresh()
        for wid, messages in stream.items():
            applier = appliers[wid]
            for frames in messages:
                assert apply_message(applier, frames)
        assert sum(a.stats.skipped_blocks for a in appliers.values()) == 0

    decoded = {wid: [decode_message(f) for f in messages] for wid, messages in stream.items()}

    def apply() -> None:
        _, appliers = fresh()
        for wid, batches in decoded.items():
            applier = appliers[wid]
            for batch in batches:
                applier.apply(batch)

    # index only: the same operations on ready hashes
    plan: list[tuple[str, bool, list[int]]] = []
    for wid, batches in decoded.items():
        ours: dict[int | bytes, int] = {}
        for batch in batches:
            for event in batch.events:
                if isinstance(event, BlockStored):
                    parent = ROOT if event.parent_block_hash is None else ours[event.parent_block_hash]
                    hs = chain_hashes(event.token_ids, args.block_size, parent)
                    ours.update(zip(event.block_hashes, hs, strict=True))
                    plan.append((wid, True, hs))
                elif isinstance(event, BlockRemoved):
                    plan.append((wid, False, [ours.pop(h) for h in event.block_hashes]))

    def index_only() -> None:
        index, _ = fresh()
        for wid, is_store, hs in plan:
            if is_store:
                index.stored(wid, hs)
            else:
                index.removed(wid, hs)

    rate("decode+apply (msgpack, hash rebuild, index)", decode_and_apply)
    apply_message = compiled_path(VLLM.adapter.kv_event_wire)
    if apply_message is not None:
        rate("compiled decode+apply (from the bytes)", compiled_decode_and_apply)
    rate("apply (hash rebuild, translation, index)", apply)
    rate("index only (stored/removed, ready hashes)", index_only)
    await bench_zmq(args, per_worker, total_blocks, total_messages)


def _zmq_sender(
    n_workers: int, block_size: int, per_worker: int, seed: int, endpoints: Any, go: Any, done: Any
) -> None:
    """Child process: one PUB socket per worker; probes until ``go``, then the whole stream as fast as it can."""
    import zmq

    stream = synthetic_stream(n_workers, block_size, per_worker, random.Random(seed), first_seq=1)  # probes are 0
    ctx = zmq.Context()
    socks = {}
    for wid in stream:
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 0)  # no drops: measure the subscriber, not the high-water mark
        socks[wid] = sock
        endpoints.put((wid, f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"))
    probe = [b"kv", (0).to_bytes(8, "big"), msgpack.packb([0.0, [], 0])]
    while not go.wait(0.01):
        for sock in socks.values():
            sock.send_multipart(probe)
    more = zmq.SNDMORE
    started = time.perf_counter()
    # The pre-encoded frames, sent one by one (send_multipart's Python costs about 2.6 us per message on top: this one
    # process stands in for 64 engines' publishers, so its own overhead should not be what the figure measures).
    for wid, messages in stream.items():
        send = socks[wid].send
        for topic, seq, payload in messages:
            send(topic, more)
            send(seq, more)
            send(payload)
    print(  # the sender (Python, as vLLM's publisher) shares the machine: its own time bounds the rate measured
        f"  (sender: {sum(len(m) for m in stream.values()):,} batches sent in {time.perf_counter() - started:.2f} s)",
        flush=True,
    )
    done.wait(180)  # keep the sockets open until everything arrived
    ctx.destroy(linger=0)


async def bench_zmq(args: argparse.Namespace, per_worker: int, total_blocks: int, total_messages: int) -> None:
    """The same stream through real ZMQ: PUB sockets in another process, the router's subscribers in this one."""
    import multiprocessing

    import zmq.asyncio

    from litellm_disagg.routing.kv.event_subscriber import KVEventSubscriber

    mp = multiprocessing.get_context("spawn")
    endpoints, go, done = mp.Queue(), mp.Event(), mp.Event()
    child = mp.Process(
        target=_zmq_sender, args=(args.workers, args.block_size, per_worker, args.seed + 1, endpoints, go, done)
    )
    child.start()
    ctx = zmq.asyncio.Context()
    index = PrefixIndex()
    subs = {}
    for _ in range(args.workers):
        wid, endpoint = await asyncio.to_thread(endpoints.get, True, 120)
        index.add_worker(wid, capacity_blocks=per_worker)
        applier = EventApplier(wid, index, block_size=args.block_size, capacity_blocks=per_worker)
        subs[wid] = KVEventSubscriber(
            endpoint,
            applier,
            decode=VLLM.adapter.decode_kv_events,
            context=ctx,
            rcvhwm=0,
            wire=VLLM.adapter.kv_event_wire,
        )
        subs[wid].start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while any(s.messages == 0 for s in subs.values()) and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    # Probes carry sequence number 0 (late ones are duplicates to the applier); the stream starts at 1.
    base = sum(s.applier.stats.batches for s in subs.values())
    go.set()
    start = time.perf_counter()

    def applied() -> int:
        return sum(s.applier.stats.batches for s in subs.values()) - base

    last_report = start
    while applied() < total_messages and time.perf_counter() - start < 120:
        await asyncio.sleep(0.002)
        if os.environ.get("BENCH_DEBUG") and time.perf_counter() - last_report > 1:
            last_report = time.perf_counter()
            print("   ...", applied(), flush=True)
    elapsed = time.perf_counter() - start
    got = applied()
    gaps = sum(s.applier.stats.gaps for s in subs.values())
    fast = sum(s.fast_messages for s in subs.values())
    print(
        f"  over ZMQ (PUB in another process -> SUB, 127.0.0.1)  "
        f"{total_blocks * got / total_messages / elapsed / 1e6:6.2f} M block events/s, {got / elapsed:,.0f} batches/s "
        f"({got:,}/{total_messages:,} batches, {gaps} gaps, {fast:,} messages on the compiled path)"
    )
    done.set()
    for s in subs.values():
        await s.stop()
    ctx.destroy(linger=0)
    child.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=1_000_000, help="blocks indexed in all (decision benchmark)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--ingest-blocks", type=int, default=1_000_000, help="block events in the ingestion stream")
    parser.add_argument("--model-dir", help="a model directory whose tokenizer and chat template to time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--turns",
        type=int,
        default=300,
        help="conversations per prompt size in the tokenized figures (a p99 of fewer than ~200 is about the maximum)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="ingestion runs per figure (best and median printed)")
    parser.add_argument(
        "--tokenize-in-thread",
        action="store_true",
        help="every tokenization in a worker thread (inline_max_new_chars 0), as before a cached next turn ran inline",
    )
    parser.add_argument(
        "--no-answer-hook",
        action="store_true",
        help="the first turn's answer is not cached when it completes (KVRouter.answered not called)",
    )
    parser.add_argument(
        "--no-turn-reuse",
        action="store_true",
        help="a next turn does not reuse the remembered turn's ids and block hashes (tokenizer.reuse_turns false)",
    )
    parser.add_argument(
        "--novel-words",
        type=int,
        default=0,
        help="words never seen before added to each follow-up question (none of their pieces is cached anywhere)",
    )
    parser.add_argument("--skip-decisions", action="store_true")
    parser.add_argument("--skip-ingestion", action="store_true")
    args = parser.parse_args()
    from litellm_disagg.routing.kv import native

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"compiled KV routing core: {'in use' if native.NATIVE else 'not in use (' + native.WHY + ')'}")
    if not args.skip_decisions:
        asyncio.run(bench_decisions(args))
    if not args.skip_ingestion:
        asyncio.run(bench_ingestion(args))


if __name__ == "__main__":
    main()
