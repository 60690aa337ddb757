"""What the planner tells operators: one structured log line per decision, and the planner metrics.

Log lines (logger ``litellm_disagg.planner``), one JSON object after a fixed prefix, so ``grep 'planner decision'``
finds them and ``jq`` reads them::

    planner decision {"model": ..., "condition": "prefill_bound", "streak": 3, "moves": [["w2", "decode", "prefill"]],
                      "held": null, "current": [1, 3, 0], "desired": [2, 2, 0], "drain": null,
                      "prefill_pressure": 1.8, "decode_pressure": 0.31, "decode_driver": "itl", "ttft_ratio": 1.8,
                      ..., "ttft_p_ms": 3600.0, "ttft_samples": 41, "itl_p_ms": 15.5, "itl_samples": 2100,
                      "transfer_ms": 35.0, "queued_prefill_tokens": 5200, "waiting_requests": 7,
                      "decode_kv_usage": 0.41, "decode_occupancy": null}

Layouts are ``[prefill, decode, both]``. A line is written at INFO when the step moves a worker or changes the
desired sizes, the worker named to drain, the condition or the mixing correction (``calibration.py``: the engine
profile found to underprice mixing); at DEBUG otherwise (every step).

Metrics (``observability/metrics.py``): ``litellm_disagg_planner_decisions_total{model,action}`` (``role_change``
per move, ``scale_up`` / ``scale_down`` when the desired total grows / shrinks), ``..._desired_workers{model,role}``
(prefill, decode, both), ``..._signal{model,signal}`` (the pressures and ratios of the last step; NaN when unknown),
``..._enabled`` and ``..._leader``.
"""

from __future__ import annotations

import json
import logging
import math

from litellm_disagg.observability import metrics as m
from litellm_disagg.planner.policy import DesiredPools, ModelDecision
from litellm_disagg.planner.signals import ModelSignals

logger = logging.getLogger("litellm_disagg.planner")

ROLES = ("prefill", "decode", "both")


def _layout(d: DesiredPools) -> list[int]:
    return [d.prefill, d.decode, d.both]


def decision_fields(decision: ModelDecision, signals: ModelSignals | None) -> dict[str, object]:
    """The flat record of one decision and the signals behind it."""
    fields: dict[str, object] = {
        "model": decision.model,
        "condition": decision.condition.value,
        "streak": decision.streak,
        "moves": [[mv.worker_id, mv.from_role.value, mv.to_role.value] for mv in decision.moves],
        "held": decision.held,
        "current": _layout(decision.current),
        "desired": _layout(decision.desired),
        "drain": decision.drain,
    }
    fields.update(decision.pressures.as_fields())
    if signals is not None:
        prefill, decode = signals.prefill_pool, signals.decode_pool
        fields.update({
            "ttft_p_ms": signals.ttft.p_ms, "ttft_samples": signals.ttft.samples,
            "itl_p_ms": signals.itl.p_ms, "itl_samples": signals.itl.samples,
            "transfer_ms": signals.transfer.p_ms, "transfer_samples": signals.transfer.samples,
            "queued_prefill_tokens": prefill.queued_prefill_tokens, "waiting_requests": prefill.waiting_requests,
            "decode_running": decode.running_requests, "decode_kv_usage": decode.kv_usage,
            "decode_occupancy": decode.batch_occupancy, "prefill_tokens_per_s": signals.prefill_tokens_per_s,
            "prompt_tokens_per_s": signals.prompt_tokens_per_s, "output_tokens_per_s": signals.output_tokens_per_s,
            "flipping": sorted(w.worker_id for w in signals.flipping),
        })
    return fields


class PlannerReport:
    """Logs and counts each step's decisions; remembers the last one per model to tell what changed."""

    def __init__(self) -> None:
        self._last: dict[str, ModelDecision] = {}

    def decided(self, decision: ModelDecision, signals: ModelSignals | None) -> bool:
        """Log and count one decision; returns whether it was worth an INFO line (something changed)."""
        previous = self._last.get(decision.model)
        self._last[decision.model] = decision
        changed = bool(decision.moves) or previous is None or (
            previous.desired != decision.desired or previous.condition is not decision.condition
            or previous.drain != decision.drain
            or previous.pressures.mixing_correction != decision.pressures.mixing_correction)
        line = "planner decision " + json.dumps(decision_fields(decision, signals), separators=(",", ":"))
        logger.log(logging.INFO if changed else logging.DEBUG, line)
        model = decision.model
        for _ in decision.moves:
            m.PLANNER_DECISIONS.labels(model, "role_change").inc()
        if previous is None or previous.desired.total != decision.desired.total:
            if decision.desired.total > decision.current.total:
                m.PLANNER_DECISIONS.labels(model, "scale_up").inc()
            elif decision.desired.total < decision.current.total:
                m.PLANNER_DECISIONS.labels(model, "scale_down").inc()
        for role in ROLES:
            m.PLANNER_DESIRED_WORKERS.labels(model, role).set(getattr(decision.desired, role))
        for name, value in decision.pressures.as_fields().items():
            if isinstance(value, str):
                continue
            m.PLANNER_SIGNAL.labels(model, name).set(math.nan if value is None else value)
        return changed

    def forget(self, model: str) -> None:
        self._last.pop(model, None)
