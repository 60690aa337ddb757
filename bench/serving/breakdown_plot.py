"""Where each arm's time to first token went, run by run: stacked bars of the parts' means (``breakdown.means``, the
``ttft_parts_mean_ms`` of the serving benchmarks' JSON), which add up to the arm's mean TTFT.

    python -m bench.serving.breakdown_plot RUN.json [RUN.json ...] --out breakdown.png [--title TITLE]

Each JSON is one ``bench.serving.pd`` output (``runs``: one row per arm and run) or one ``bench.serving`` output
(``arms``); rows without the means (the simulator before they were saved, or ``--no-engine-traces``) are skipped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.serving.breakdown import PARTS

COLORS = {"proxy_in": "tab:blue", "frontend": "tab:orange", "queue": "tab:olive", "prefill": "tab:red",
          "handoff": "tab:cyan", "admit": "tab:purple", "transfer": "tab:pink", "decode_first": "tab:brown",
          "proxy_out": "tab:gray"}


def rows_of(path: Path) -> list[tuple[str, dict[str, float]]]:
    """(label, means) per arm and run in one benchmark JSON, in its order."""
    data = json.loads(path.read_text())
    out = []
    for row in data.get("runs") or data.get("arms") or []:
        means = row.get("ttft_parts_mean_ms") or {}
        if means:
            label = f"{row['arm'].removeprefix('pd_')}\nrun {row['run']}" if "run" in row else row["arm"]
            out.append((label, means))
    return out


def plot(rows: list[tuple[str, dict[str, float]]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.6))
    x = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for part in PARTS:
        heights = [means.get(part, 0.0) for _, means in rows]
        if not any(heights):
            continue
        ax.bar(x, heights, bottom=bottom, label=part, color=COLORS[part], width=0.7)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(x, [label for label, _ in rows], fontsize=8)
    ax.set_ylabel("mean over the arm's requests (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--title", default="where the time to first token went (parts' means)")
    args = p.parse_args(argv)
    rows = [row for path in args.runs for row in rows_of(path)]
    if not rows:
        raise SystemExit("no row with ttft_parts_mean_ms in the given files")
    plot(rows, args.title, args.out)
    print(f"wrote {args.out} ({len(rows)} bars)")


if __name__ == "__main__":
    main()
