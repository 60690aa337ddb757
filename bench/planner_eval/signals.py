"""``ClusterSignals`` (``litellm_disagg.planner.signals``, the planner's input) from the simulated state.

Per worker: its published role and the flip in progress, running and waiting requests, prompt tokens queued for
prefill there, batch capacity and KV usage (what the proxy's accounting and the load scraper give the planner).
Per model: TTFT and ITL percentiles of the requests that finished in the last ``signal_window_s``, the measured KV
transfer time, the prefill rate of one worker (the timing model's, as a measured figure would converge to), and the
load: prompt tokens of the requests that arrived in the window and tokens generated in it, per second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.planner_eval.routing import MODEL
from litellm_disagg.planner.signals import ClusterSignals, LatencyWindow, ModelSignals, WorkerSignals
from litellm_disagg.runtime_config import WorkerState

if TYPE_CHECKING:
    from bench.planner_eval.cluster import Cluster
    from bench.planner_eval.engine import Req

QUANTILE = 0.9
"""The percentile the windows report: the one goodput's attainment (90% of requests) is about."""


def collect(cluster: Cluster, now: float) -> ClusterSignals:
    window = cluster.config.signal_window_s
    since = now - window
    ttft: list[float] = []
    itl: list[float] = []
    prefill: list[float] = []
    prompt_tokens = 0
    output_tokens = 0.0
    for req in reversed(cluster.requests):
        if req.arrival < since - 600:
            break  # requests are in arrival order; none this old finished in the window
        if req.arrival >= since:
            prompt_tokens += req.prompt
        output_tokens += _generated_in(req, since, now)
        if req.remote and req.prefill_done is not None:
            if req.prefill_done >= since:
                prefill.append((req.prefill_done - req.arrival) * 1e3)
        elif req.first_token is not None and req.first_token >= since:
            prefill.append((req.first_token - req.arrival) * 1e3)
        if cluster.config.prefill_side_ttft and req.remote and req.prefill_done is not None:
            if req.prefill_done >= since:
                ttft.append((req.prefill_done - req.arrival) * 1e3)
        elif req.first_token is not None and req.first_token >= since:
            ttft.append((req.first_token - req.arrival) * 1e3)
        if req.finish is not None and req.finish >= since and req.output >= 2:
            itl.append((req.finish - req.first_token) / (req.output - 1) * 1e3)  # type: ignore[operator]
    span = min(window, now)
    transfers = [s * 1e3 for t, s in cluster.pulls_done[-2000:] if t >= since]
    workers = tuple(
        WorkerSignals(
            worker_id=wid,
            model=MODEL,
            role=w.role,
            state=WorkerState.READY,
            pending_role=w.pending_role,
            running_requests=w.running,
            waiting_requests=len(w.queued) + len(w.pull_queue) + w.pulling + len(w.ready),
            queued_prefill_tokens=w.queued_prefill_tokens,
            max_running_requests=cluster.config.engine.max_num_seqs,
            kv_usage=w.kv_usage,
        )
        for wid, w in cluster.workers.items()
    )
    model = ModelSignals(
        model=MODEL,
        workers=workers,
        ttft=LatencyWindow.of(ttft, QUANTILE),
        itl=LatencyWindow.of(itl, QUANTILE),
        transfer=LatencyWindow.of(transfers, QUANTILE),
        prefill_tokens_per_s=cluster.config.timing.prefill_tokens_per_s,
        prefill_time=LatencyWindow.of(prefill, QUANTILE),
        prompt_tokens_per_s=prompt_tokens / span if span > 0 else None,
        output_tokens_per_s=output_tokens / span if span > 0 else None,
    )
    return ClusterSignals.of([model])


def _generated_in(req: Req, since: float, now: float) -> float:
    """Tokens ``req`` generated in ``[since, now]``, spread evenly over its decode time (a request's tokens come at
    its steps' pace; the engine's generation counter gives the same total)."""
    start = req.first_token
    if start is None or start > now:
        return 0.0
    end = req.finish if req.finish is not None else now
    tokens = req.output if req.finish is not None else req.generated
    if end <= start:
        return float(tokens) if since <= start else 0.0
    overlap = max(0.0, min(end, now) - max(start, since))
    return tokens * overlap / (end - start)
