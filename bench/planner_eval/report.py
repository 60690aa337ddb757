"""Markdown tables from the experiments' results: ranges over seeds (min-max), the best static split per phase, the
ratios the issue's targets are about."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench.planner_eval.arms import one_to_one, static_split_names
from bench.planner_eval.run import GoodputCell, Timeline


def _range(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def _by(cells: Sequence[GoodputCell]) -> dict[tuple[str, str], dict[int, float]]:
    out: dict[tuple[str, str], dict[int, float]] = {}
    for c in cells:
        out.setdefault((c.phase, c.arm), {})[c.seed] = c.rate
    return out


def best_static(cells: Sequence[GoodputCell], phase: str, workers: int) -> str:
    """The static split with the highest median goodput over the seeds in ``phase``."""
    by = _by(cells)
    names = [n for n in static_split_names(workers) if (phase, n) in by]
    return max(names, key=lambda n: statistics.median(by[(phase, n)].values()))


def goodput_markdown(cells: Sequence[GoodputCell], phases: Sequence[str], workers: int, planners: Sequence[str]) -> str:
    by = _by(cells)
    seeds = sorted({c.seed for c in cells})
    lines = [
        "| phase | aggregated | static 1:1 | best static split | " + " | ".join(planners) + " |",
        "|---|---|---|---|" + "---|" * len(planners),
    ]
    for phase in phases:
        best = best_static(cells, phase, workers)
        row = [
            phase,
            _range(list(by[(phase, "aggregated")].values())),
            _range(list(by[(phase, one_to_one(workers))].values())),
            f"{_range(list(by[(phase, best)].values()))} ({best})",
        ] + [_range(list(by[(phase, p)].values())) for p in planners]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(f"Goodput in requests/s, range over seeds {seeds}.")
    return "\n".join(lines)


def sweep_markdown(cells: Sequence[GoodputCell], phases: Sequence[str], workers: int) -> str:
    by = _by(cells)
    names = ["aggregated"] + static_split_names(workers)
    lines = ["| phase | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for phase in phases:
        lines.append(
            "| " + phase + " | " + " | ".join(_range(list(by[(phase, n)].values())) for n in names if (phase, n) in by) + " |"
        )
    return "\n".join(lines)


def targets_markdown(cells: Sequence[GoodputCell], phases: Sequence[str], workers: int, planner: str) -> str:
    """Per seed ratios: planner / best static split (that seed's best), planner / aggregated, best static /
    aggregated."""
    by = _by(cells)
    seeds = sorted({c.seed for c in cells})
    lines = [
        f"| phase | {planner} / best static | {planner} / aggregated | best static / aggregated |",
        "|---|---|---|---|",
    ]
    for phase in phases:
        r_best, r_agg, r_static = [], [], []
        for s in seeds:
            best = max(by[(phase, n)][s] for n in static_split_names(workers) if (phase, n) in by)
            agg = by[(phase, "aggregated")][s]
            plan = by[(phase, planner)][s]
            r_best.append(plan / best if best else float("nan"))
            r_agg.append(plan / agg if agg else float("nan"))
            r_static.append(best / agg if agg else float("nan"))
        lines.append(
            f"| {phase} | {_range(r_best, '{:.2f}')} | {_range(r_agg, '{:.2f}')} | {_range(r_static, '{:.2f}')} |"
        )
    return "\n".join(lines)


def timeline_markdown(timelines: Sequence[Timeline], phases: Sequence[str]) -> str:
    arms = list(dict.fromkeys(t.arm for t in timelines))
    head = (
        "| arm | "
        + " | ".join(f"{p} attainment" for p in phases)
        + " | "
        + " | ".join(f"back within SLO after -> {p}" for p in phases[1:])
        + " | moves |"
    )
    lines = [head, "|---|" + "---|" * (2 * len(phases))]
    for arm in arms:
        ts = [t for t in timelines if t.arm == arm]
        cells = [_range([t.phase_attainment[p] * 100 for t in ts], "{:.0f}%") for p in phases]
        rec = []
        for p in phases[1:]:
            vals = [t.recovery_s[p] for t in ts]
            rec.append(", ".join("never" if v is None else f"{v:.0f} s" for v in vals))
        moves = _range([float(t.moves) for t in ts], "{:.0f}")
        lines.append(f"| {arm} | " + " | ".join(cells + rec) + f" | {moves} |")
    seeds = sorted({t.seed for t in timelines})
    lines.append("")
    lines.append(
        f"Attainment: share of the phase's requests meeting both targets (range over seeds {seeds}); back within "
        "SLO: from the shift to the first 5 s window after which every window of the phase is at >= 90% (one "
        "figure per seed; 0 s: no window missed)."
    )
    return "\n".join(lines)
