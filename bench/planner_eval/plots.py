"""PNG plots (matplotlib, the ``bench`` extra): goodput per phase and arm; SLO attainment over time across the
phase shifts, with the planner's pool sizes."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from bench.planner_eval.run import GoodputCell, Timeline
from bench.planner_eval.workload import Segment


def goodput_plot(cells: Sequence[GoodputCell], phases: Sequence[str], arms: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(phases), figsize=(5 * len(phases), 4.2), sharey=False)
    for ax, phase in zip(axes, phases, strict=True):
        meds, los, his = [], [], []
        for arm in arms:
            vals = [c.rate for c in cells if c.phase == phase and c.arm == arm]
            m = statistics.median(vals)
            meds.append(m)
            los.append(m - min(vals))
            his.append(max(vals) - m)
        colors = ["tab:gray"] + ["tab:blue"] * (len(arms) - 4) + ["tab:red", "tab:orange", "tab:purple"]
        ax.bar(range(len(arms)), meds, yerr=[los, his], color=colors[: len(arms)], capsize=3)
        ax.set_xticks(range(len(arms)), arms, rotation=60, ha="right", fontsize=8)
        ax.set_title(phase)
        ax.set_ylabel("goodput (req/s, >=90% within TTFT and ITL SLO)")
    fig.suptitle("Goodput per phase: aggregated (gray), static splits (blue), planner (red, orange, purple); median, range")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def timeline_plot(timelines: Sequence[Timeline], segments: Sequence[Segment], seed: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = [t for t in timelines if t.seed == seed]
    planners = [t for t in ts if t.arm.startswith("planner")]
    fig, axes = plt.subplots(1 + len(planners), 1, figsize=(11, 3.2 * (1 + len(planners))), sharex=True)
    ax = axes[0]
    for t in ts:
        ax.plot([p.t + 2.5 for p in t.points], [p.attainment * 100 for p in t.points], label=t.arm, lw=1.3)
    ax.axhline(90, color="k", ls=":", lw=0.8)
    ax.set_ylabel("SLO attainment (%) per 5 s")
    ax.set_ylim(-3, 103)
    ax.legend(fontsize=8, loc="lower left")
    start = 0.0
    for seg in segments:
        for a in axes:
            a.axvline(start, color="k", lw=0.6)
        ax.text(start + 2, 50, f"{seg.phase}\n{seg.rate:.1f} req/s", fontsize=8)
        start += seg.duration_s
    for a, t in zip(axes[1:], planners, strict=True):
        xs = [p.t for p in t.pools] + [start]
        for attr, color in (("prefill", "tab:red"), ("decode", "tab:blue"), ("both", "tab:gray")):
            ys = [getattr(p, attr) for p in t.pools]
            a.step(xs, ys + ys[-1:], where="post", label=attr, color=color)
        a.set_ylabel(f"{t.arm}\nworkers")
        a.legend(fontsize=8, loc="upper right")
    axes[-1].set_xlabel("simulated seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
