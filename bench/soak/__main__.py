"""Soak benchmark: concurrent streaming requests through the litellm-disagg strategy over simulated workers that
join, drain and crash during the run. Prints the counts and latencies and writes a PNG.

    .venv/bin/python -m bench.soak [--requests 1000] [--concurrency 300] [--prefill 3] [--decode 4] [--disconnects 40] [--ramp 6]
                                     [--no-decode-crash] [--no-liveness] [--no-kv-release] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench.soak.harness import SoakConfig, SoakReport, run_soak  # noqa: E402


def plot(report: SoakReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ok = [o for o in report.outcomes if o.ok]
    ax1.hist([o.latency_s * 1000 for o in ok], bins=40, alpha=0.7, label="end-to-end")
    ax1.hist([o.ttft_s * 1000 for o in ok if o.ttft_s is not None], bins=40, alpha=0.7, label="TTFT")
    ax1.set_xlabel("ms")
    ax1.set_ylabel("requests")
    ax1.set_title(f"{report.completed} completed, {report.failed} failed, {report.lost} lost, {report.ended_twice} twice")
    ax1.legend()
    done = sorted(o.finished_at_s for o in report.outcomes if o.ok)
    failed = sorted(o.finished_at_s for o in report.outcomes if o.ends and not o.ok)
    ax2.plot(done, range(1, len(done) + 1), label="completed (cumulative)")
    ax2.plot(failed, range(1, len(failed) + 1), color="red", label="failed (cumulative)")
    ax2.legend(loc="center right")
    for t, what in report.events:
        ax2.axvline(t, color="red" if "crash" in what else "gray", linestyle="--", linewidth=0.8)
        ax2.text(t, len(report.outcomes) * 0.02, what.split(" with ")[0], rotation=90, fontsize=7, va="bottom")
    ax2.set_xlabel("s since the load started")
    ax2.set_title("worker events during the run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=300)
    parser.add_argument("--prefill", type=int, default=3)
    parser.add_argument("--decode", type=int, default=4)
    parser.add_argument("--speedup", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-chaos", action="store_true")
    parser.add_argument("--no-kv-release", action="store_true",
                        help="leave unread prefill KV to the engine's lease (the before of the KV-release comparison)")
    parser.add_argument("--ramp", type=float, default=0.0,
                        help="the first --concurrency clients start spread over this many seconds (0: all at once)")
    parser.add_argument("--no-decode-crash", action="store_true",
                        help="the same faults but the decode crash (the control arm of the pause after it)")
    parser.add_argument("--no-liveness", action="store_true",
                        help="no port probe after a failure and no replacement of a decode worker that died during the "
                             "prefill: only the failure cooldown keeps new requests off a crashed worker until discovery "
                             "drops it (the before of the liveness comparison)")
    parser.add_argument("--disconnects", type=int, default=0,
                        help="clients that go away (half right after their prefill, half after the first chunk)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    config = SoakConfig(requests=args.requests, concurrency=args.concurrency, prefill=args.prefill, decode=args.decode,
                        speedup=args.speedup, seed=args.seed, chaos=not args.no_chaos, disconnects=args.disconnects,
                        kv_release=not args.no_kv_release, liveness=not args.no_liveness,
                        decode_crash=not args.no_decode_crash, ramp_s=args.ramp)
    report = asyncio.run(run_soak(config, Path(tempfile.mkdtemp(prefix="soak-"))))
    print(report.summary())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / ("soak-no-kv-release.png" if not config.kv_release else "soak-no-liveness.png" if not config.liveness
                 else "soak-no-decode-crash.png" if not config.decode_crash else "soak.png")
    plot(report, png)
    print(f"plot: {png}")


if __name__ == "__main__":
    main()
