"""What the serving benchmarks' commands (``__main__``, ``replicas``, ``pd``) share once their arguments are parsed:
the run directory for logs and configs, and the workload shape."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.serving.workloads import Shape


def new_run_dir(prefix: str) -> Path:
    """A fresh temporary directory for one benchmark run's logs and configs; its path is printed."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    print(f"logs and configs: {run_dir}", flush=True)
    return run_dir


def shape_from_args(args: argparse.Namespace) -> Shape:
    """The workload shape from ``--requests --rate --turns --think --prefix-words --question-words --documents`` and,
    where the command has it, ``--zipf`` (else the shape's default skew)."""
    return Shape(requests=args.requests, rate=args.rate, turns=args.turns, think_s=args.think,
                 prefix_words=args.prefix_words, question_words=args.question_words, documents=args.documents,
                 zipf_s=getattr(args, "zipf", Shape.zipf_s))
