"""Per-request timing of a simulated engine: one JSON line per finished request, for benchmarks that attribute TTFT.

Off unless ``SimSettings.request_log`` names a file (``--request-log`` on the command line). The engine keeps one
``RequestTrace`` per request in flight and stamps it (``SimEngine``); nothing here schedules or decides.

    arrived        the engine got the request (after the HTTP server parsed and tokenized it)
    scheduled      start of the first step that computed part of its prompt (decode side of a transfer: the step
                   that recomputes the prompt's last token, after the pull)
    pull_started   decode side of a transfer: blocks allocated, the pull began (None without a transfer)
    pull_ended     the KV arrived (or the pull failed)
    first_token    end of the step that sampled its first output token
    finished       end of the step that sampled its last one

Times are ``time.monotonic()`` seconds (the event loop's clock): on Linux one system-wide clock, so a client on the
same host can subtract its own readings (the proxy's share of a TTFT is the client's send to ``arrived``, and
``first_token`` to the client's first chunk). ``client_id`` is the request's ``X-Request-Id`` (or the id the server
made up), which the router sends to both the prefill and the decode call of one request; ``user`` is the OpenAI
``user`` field, which a client can set to find its own requests.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

_OPEN: dict[str, IO[str]] = {}
"""One append handle per path, shared by the engines of a process (one event loop: lines never interleave)."""


@dataclass
class RequestTrace:
    worker_id: str
    role: str
    request_id: str
    client_id: str
    user: str | None
    prompt_tokens: int
    arrived: float
    running_at_arrival: int
    """Requests in the running batch when it arrived."""
    waiting_at_arrival: int
    """Requests queued (or pulling KV) when it arrived."""
    prefill_tokens_ahead: int
    """Prompt tokens not yet computed of the requests running or queued when it arrived (cache hits not deducted)."""
    cached_tokens: int = 0
    """Prompt tokens served from this engine's prefix cache."""
    external_tokens: int = 0
    """Prompt tokens pulled from another engine."""
    scheduled: float | None = None
    pull_started: float | None = None
    pull_ended: float | None = None
    first_token: float | None = None
    finished: float | None = None
    prefill_steps: int = 0
    """Steps that computed part of its prompt."""
    shared_prefill_tokens: int = 0
    """Other requests' prompt tokens computed in those steps."""
    shared_decode_seqs: int = 0
    """Decoding sequences in those steps, summed over the steps."""
    preemptions: int = 0
    received: float | None = None
    """When the HTTP server got the request, before parsing and tokenizing it: set only by traces made from vLLM's
    spans (``bench/serving/engine_traces.py``); the simulator's ``arrived`` is already past that."""


def client_id_of(request_id: str) -> str:
    """The ``X-Request-Id`` of an engine request id (``chatcmpl-<id>-<n>`` / ``cmpl-<id>-<n>``)."""
    base = request_id.rsplit("-", 1)[0]
    for prefix in ("chatcmpl-", "cmpl-"):
        if base.startswith(prefix):
            return base[len(prefix) :]
    return base


def write(path: str, trace: RequestTrace) -> None:
    """Append ``trace`` as one JSON line to ``path`` (opened once per process, line-buffered)."""
    handle = _OPEN.get(path)
    if handle is None:
        handle = _OPEN[path] = Path(path).open("a", buffering=1, encoding="utf-8")
    handle.write(json.dumps(asdict(trace), separators=(",", ":")) + "\n")


def read(path: Path, offset: int = 0) -> tuple[list[RequestTrace], int]:
    """The traces written to ``path`` from byte ``offset`` on, and the offset after the last whole line."""
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    traces = [RequestTrace(**json.loads(line)) for line in data[:end].splitlines() if line.strip()]
    return traces, offset + end
