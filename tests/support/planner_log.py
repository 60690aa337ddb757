"""The planner's decisions as it logs them (``planner decision {json}``, one line per model and step)."""

from __future__ import annotations

import json


def planner_decisions(log: str) -> list[dict]:
    return [json.loads(line.split("planner decision ", 1)[1]) for line in log.splitlines()
            if "planner decision " in line]


def planner_moves(log: str) -> list[tuple[str, list[str]]]:
    """Every move as (condition, [worker_id, from_role, to_role]), in order."""
    return [(d["condition"], mv) for d in planner_decisions(log) for mv in d["moves"]]
