"""What the serving benchmarks' commands (``__main__``, ``replicas``, ``pd``) share: the workers' arguments, and once
the arguments are parsed, the run directory for logs and configs and the workload shape."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.serving.workloads import Shape


def add_worker_arguments(parser: argparse.ArgumentParser, *, kv_cache_mib: int) -> None:
    """The simulated and the real vLLM workers' options (``kv_cache_mib``: the real workers' default KV cache)."""
    sim = parser.add_argument_group("simulated workers")
    sim.add_argument("--speedup", type=float, default=1.0)
    sim.add_argument("--blocks", type=int, default=4096, help="KV blocks per worker")
    sim.add_argument("--block-size", type=int, default=16)
    real = parser.add_argument_group("real vLLM workers")
    real.add_argument("--model-dir", help="model directory (default: SmolLM2-135M-Instruct, prepared offline)")
    real.add_argument("--served-model-name", default="smollm2")
    real.add_argument("--kv-cache-mib", type=int, default=kv_cache_mib)
    real.add_argument("--max-model-len", type=int, default=4096)
    real.add_argument("--no-engine-traces", dest="engine_traces", action="store_false",
                      help="do not collect the workers' OpenTelemetry spans (the per-request TTFT breakdown)")


def new_run_dir(prefix: str) -> Path:
    """A fresh temporary directory for one benchmark run's logs and configs; its path is printed, and which KV
    routing core the proxies will run (``kv_core_line``)."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    print(f"logs and configs: {run_dir}", flush=True)
    print(kv_core_line(), flush=True)
    return run_dir


def kv_core_line() -> str:
    """Whether this tree's KV routing core is compiled (as ``scripts/setup.sh`` builds it in place) or the pure-Python
    fallback: a fresh ``git clone`` has no compiled modules (they are built, not tracked), and its proxies then run
    slower index and event paths than the shipped setup."""
    from litellm_disagg.routing.kv import native

    if native.NATIVE and native.wire is not None:
        return "KV routing core: compiled"
    why = native.WHY or "the KV-event module is not built"
    return f"KV routing core: PURE PYTHON ({why}): not the path scripts/setup.sh ships; its figures are not comparable"


def shape_from_args(args: argparse.Namespace) -> Shape:
    """The workload shape from ``--requests --rate --turns --think --prefix-words --question-words --documents`` and,
    where the command has it, ``--zipf`` (else the shape's default skew)."""
    return Shape(requests=args.requests, rate=args.rate, turns=args.turns, think_s=args.think,
                 prefix_words=args.prefix_words, question_words=args.question_words, documents=args.documents,
                 zipf_s=getattr(args, "zipf", Shape.zipf_s))
