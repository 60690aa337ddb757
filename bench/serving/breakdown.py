"""Where each request's time to first token went: the client's timings joined with the workers' request traces
(simulated workers: ``litellm_disagg/sim/request_log.py``, ``--request-log``; real vLLM workers: their OpenTelemetry
spans, ``engine_traces.py``).

The load generator names every request in OpenAI's ``user`` field (``<session>#<turn>``); a simulated worker that
decoded it keeps that name in its trace. vLLM's spans do not carry it: there the request is found by its id, which
the load generator reads from the stream (``chatcmpl-<id>``) and vLLM's span carries. A remote prefill of the same
request carries the same ``X-Request-Id`` as its decode (the router sends one id to both). From these, per request,
on one monotonic clock::

    aggregated (one worker):  TTFT = proxy_in [+ frontend] + queue + prefill + proxy_out
    disaggregated:            TTFT = proxy_in [+ frontend] + queue + prefill (on the prefill worker) + handoff
                                     + admit (decode: blocks for the pull) + transfer + decode_first + proxy_out

    proxy_in      the client's send to the first worker's arrival: the proxy's work before it calls a worker
                  (LiteLLM, tokenization, the routing decision) and the HTTP hop
    frontend      vLLM only: its API server's work (chat template, tokenization) and the wait until the engine
                  core takes the request in, which it does between steps: a long step ahead of it shows here, not
                  in ``queue``; the simulator's arrival is already past it
    queue         arrival to the first step that computed part of the prompt: the wait behind the worker's queue
    prefill       that step's start to the first token: the prompt's own chunks and whatever shared their steps
    handoff       the prefill's end to the decode worker's arrival: the proxy between the two calls
    admit         the decode worker's arrival to the pull's start (vLLM: its API server and queue before it
                  scheduled the request)
    transfer      the decode worker's pull of the prompt's KV (simulator only: vLLM's span does not time it)
    decode_first  the pull's end to the first token: the decode worker's queue and the step that samples it
                  (vLLM: from the pull's start, the pull and that step together)
    proxy_out     the worker's first token to the client's first content chunk

Pure: no I/O (the caller reads the traces).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.serving.engine_traces import client_id_of_response
from bench.serving.loadgen import RequestResult
from bench.serving.report import percentile
from litellm_disagg.sim.request_log import RequestTrace

PARTS = ("proxy_in", "frontend", "queue", "prefill", "handoff", "admit", "transfer", "decode_first", "proxy_out")


@dataclass(frozen=True)
class Breakdown:
    user: str
    ttft_ms: float
    worker: str
    """The worker that decoded (and, aggregated, prefilled) it."""
    prefill_worker: str | None
    """The prefill worker of a remote prefill, else None."""
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens the worker that computed the prompt found in its prefix cache."""
    running_at_arrival: int
    waiting_at_arrival: int
    prefill_tokens_ahead: int
    """On the worker that computed the prompt, when the request arrived there."""
    shared_prefill_tokens: int
    """Other requests' prompt tokens in the steps that computed this prompt."""
    parts_ms: dict[str, float]
    """``PARTS`` that apply, in milliseconds; they add up to ``ttft_ms``."""


def _ms(a: float | None, b: float | None) -> float:
    return (b - a) * 1e3 if a is not None and b is not None else math.nan


def join(results: Iterable[RequestResult], traces: Iterable[RequestTrace]) -> list[Breakdown]:
    """One breakdown per successful request found in the traces (a retried request: its last decode)."""
    by_user: dict[str, RequestTrace] = {}
    by_id: dict[str, RequestTrace] = {}
    prefill: dict[str, RequestTrace] = {}
    for t in traces:
        if t.role == "prefill":
            prefill[t.client_id] = t
        elif t.user is not None:
            by_user[t.user] = t
        else:
            by_id[t.client_id] = t
    out = []
    for r in results:
        d = by_user.get(r.user) or by_id.get(client_id_of_response(r.response_id))
        if r.error is not None or r.ttft_s is None or d is None:
            continue
        p = prefill.get(d.client_id) if d.external_tokens or d.pull_started is not None else None
        first_chunk = r.sent_at + r.ttft_s
        computing = p if p is not None else d
        parts = {"proxy_in": _ms(r.sent_at, _reached(computing))}
        if computing.received is not None:
            parts["frontend"] = _ms(computing.received, computing.arrived)
        parts |= {"queue": _ms(computing.arrived, computing.scheduled),
                  "prefill": _ms(computing.scheduled, computing.first_token)}
        if p is not None:
            pulled = d.pull_ended if d.pull_ended is not None else d.pull_started
            parts |= {"handoff": _ms(p.finished, _reached(d)), "admit": _ms(_reached(d), d.pull_started)}
            if d.pull_ended is not None:
                parts["transfer"] = _ms(d.pull_started, d.pull_ended)
            parts["decode_first"] = _ms(pulled, d.first_token)
        parts["proxy_out"] = _ms(d.first_token, first_chunk)
        out.append(Breakdown(
            user=r.user, ttft_ms=r.ttft_s * 1e3, worker=d.worker_id, prefill_worker=p.worker_id if p else None,
            prompt_tokens=computing.prompt_tokens, cached_tokens=computing.cached_tokens,
            running_at_arrival=computing.running_at_arrival, waiting_at_arrival=computing.waiting_at_arrival,
            prefill_tokens_ahead=computing.prefill_tokens_ahead, shared_prefill_tokens=computing.shared_prefill_tokens,
            parts_ms=parts))
    return out


def _reached(t: RequestTrace) -> float:
    """When the request reached the worker: its HTTP server (vLLM's spans), else the engine."""
    return t.received if t.received is not None else t.arrived


def slowest(rows: Sequence[Breakdown], fraction: float = 0.02, at_least: int = 3) -> list[Breakdown]:
    """The slowest ``fraction`` of the requests by TTFT (at least ``at_least``), slowest first."""
    n = max(at_least, math.ceil(fraction * len(rows)))
    return sorted(rows, key=lambda b: b.ttft_ms, reverse=True)[:n]


def worker_side_ms(b: Breakdown) -> float:
    """TTFT less the proxy's parts (``proxy_in``, ``handoff`` between a prefill and its decode, ``proxy_out``): what
    placement and the workers made of it, whatever the proxy's CPU was doing."""
    return b.ttft_ms - b.parts_ms["proxy_in"] - b.parts_ms.get("handoff", 0.0) - b.parts_ms["proxy_out"]


def medians(rows: Sequence[Breakdown]) -> dict[str, float]:
    """Each part's p50 over the requests it applies to, TTFT's, and the worker side's p50 and p99."""
    out = {"ttft": percentile([b.ttft_ms for b in rows], 0.5)}
    worker = [w for b in rows if not math.isnan(w := worker_side_ms(b))]
    if worker:
        out["worker_side"] = percentile(worker, 0.5)
        out["worker_side_p99"] = percentile(worker, 0.99)
    for part in PARTS:
        values = [v for b in rows if not math.isnan(v := b.parts_ms.get(part, math.nan))]
        if values:
            out[part] = percentile(values, 0.5)
    return out


def means(rows: Sequence[Breakdown]) -> dict[str, float]:
    """TTFT's mean and each part's mean over all the requests, a part that does not apply to a request (or that its
    traces do not time, as vLLM's pull) counted as 0 there: the parts' means add up to TTFT's mean, so each one's
    share of it says where the arm's time to first token went."""
    if not rows:
        return {}
    out = {"ttft": sum(b.ttft_ms for b in rows) / len(rows)}
    for part in PARTS:
        values = [b.parts_ms.get(part, 0.0) for b in rows]
        if any(part in b.parts_ms for b in rows):
            out[part] = sum(0.0 if math.isnan(v) else v for v in values) / len(rows)
    return out


LONG_PREFILL_AHEAD = 1024
"""Prompt tokens still to compute ahead of a request on its worker from which ``behind_long_prefill`` counts it."""


def behind_long_prefill(rows: Sequence[Breakdown], ahead_min: int = LONG_PREFILL_AHEAD) -> tuple[int, int]:
    """(reused, behind): requests that found most of their prompt cached (a conversation's next turn, a shared
    document), and how many of them arrived on their worker behind at least ``ahead_min`` prompt tokens still to
    compute (typically another request's cold prompt). Placing a cold prompt on a worker that is about to get such a
    request costs that request a prefill's wait: the count shows how often a placement did (issue 13 item 4)."""
    reused = [b for b in rows if b.cached_tokens * 2 >= b.prompt_tokens > 0]
    return len(reused), sum(1 for b in reused if b.prefill_tokens_ahead >= ahead_min)


def table(arm: str, rows: Sequence[Breakdown], fraction: float = 0.02) -> str:
    """The slowest requests of one arm, part by part, and the p50 of each part over all of them."""
    if not rows:
        return f"{arm}: no request traces (simulated workers' request log, or vLLM's spans with --engine-traces)"
    worst = slowest(rows, fraction)
    parts = [p for p in PARTS if any(p in b.parts_ms for b in worst)]
    head = (f"  {'request':12s} {'TTFT':>6s} " + " ".join(f"{p:>12s}" for p in parts)
            + f"  {'worker (prefill>decode)':30s} {'prompt':>6s} {'cached':>6s} {'run/wait':>8s} {'ahead':>6s} "
            f"{'shared':>6s}")
    lines = [f"{arm}: slowest {len(worst)} of {len(rows)} requests by TTFT (ms)", head]
    for b in worst:
        where = b.worker if b.prefill_worker is None else f"{b.prefill_worker}>{b.worker}"
        lines.append(
            f"  {b.user:12s} {b.ttft_ms:6.0f} " + " ".join(f"{b.parts_ms.get(p, math.nan):12.1f}" for p in parts)
            + f"  {where[-30:]:30s} {b.prompt_tokens:6d} {b.cached_tokens:6d} "
            f"{f'{b.running_at_arrival}/{b.waiting_at_arrival}':>8s} {b.prefill_tokens_ahead:6d} "
            f"{b.shared_prefill_tokens:6d}")
    mid = medians(rows)
    lines.append("  p50 over all: " + ", ".join(f"{k} {v:.1f}" for k, v in mid.items()))
    mean = means(rows)
    lines.append("  mean over all (the parts add up to TTFT): " + ", ".join(f"{k} {v:.1f}" for k, v in mean.items()))
    reused, behind = behind_long_prefill(rows)
    if reused:
        lines.append(f"  mostly cached requests behind a long prefill ({LONG_PREFILL_AHEAD}+ tokens ahead): {behind} of "
                     f"{reused}")
    return "\n".join(lines)
