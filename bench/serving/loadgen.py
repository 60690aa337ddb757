"""Send a schedule's sessions through the proxy, streaming, and time each request's tokens.

Several proxy replicas (``base_url`` a list): sessions are spread over them round robin, one session's turns all
through the same replica, as a load balancer with session stickiness in front of them would.

Each session starts at its scheduled offset; its turns run one after another (``think_s`` apart). Multi-turn
conversations resend their history with the model's actual answers. Timing is per request: TTFT (first content
chunk), inter-token latency (mean gap between content chunks after the first), end-to-end latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from bench.serving.arms import Arm, Placement, pinned_group
from bench.serving.workloads import Schedule, Session, conversation
from litellm_disagg.http_client import pooled_client


@dataclass(frozen=True)
class RequestResult:
    session: str
    turn: int
    prefix_key: str
    start_s: float
    """Since the run started."""
    ttft_s: float | None
    latency_s: float
    itl_s: float | None
    output_chunks: int
    error: str | None = None
    user: str = ""
    """The request's name (``<session>#<turn>``), sent in OpenAI's ``user`` field inside ``extra_body`` (LiteLLM
    drops a top-level ``user`` for vLLM, and merges ``extra_body`` into the worker's body): simulated workers keep it
    in their request traces (``breakdown.py``)."""
    sent_at: float = 0.0
    """``time.monotonic()`` when it was sent."""
    response_id: str = ""
    """The stream's ``id`` (``chatcmpl-<id>``, the worker's, which LiteLLM passes on): how ``breakdown.py`` finds a
    request in vLLM's spans, which carry no ``user``."""


async def run(schedule: Schedule, *, arm: Arm, base_url: str | Sequence[str], key: str, model: str, workers: int,
              max_tokens: int, concurrency_limit: int = 1000) -> tuple[list[RequestResult], float]:
    """Returns every request's result and the run's wall time (first start to last end). ``base_url``: one proxy, or
    the replicas to spread the sessions over (round robin by session)."""
    placement = Placement(arm.name, workers) if arm.pinned else None
    results: list[RequestResult] = []
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    async with contextlib.AsyncExitStack() as stack:
        # Safe against the keep-alive race with the proxy (litellm_disagg.http_client's docstring).
        clients = [await stack.enter_async_context(pooled_client(
            base_url=url, timeout=httpx.Timeout(600, connect=10), max_connections=concurrency_limit,
            max_keepalive_connections=concurrency_limit)) for url in urls]
        t0 = time.monotonic()

        async def one_session(session: Session, client: httpx.AsyncClient) -> None:
            await asyncio.sleep(max(0.0, session.start_s - (time.monotonic() - t0)))
            answers: list[str] = []
            for index, turn in enumerate(session.turns):
                group = model if placement is None else pinned_group(model, placement.pick(turn.prefix_key))
                headers = {"Authorization": f"Bearer {key}"}
                if arm.session_header:
                    headers["x-litellm-session-id"] = session.session_id
                body = {"model": group, "messages": conversation(session, index, answers), "max_tokens": max_tokens,
                        "temperature": 0, "stream": True, "extra_body": {"user": request_name(session, index)}}
                result, answer = await _one(client, body, headers, session, index, t0)
                results.append(result)
                if result.error is not None:
                    return  # a conversation whose turn failed ends there
                answers.append(answer)
                if index + 1 < len(session.turns):
                    await asyncio.sleep(session.think_s)

        await asyncio.gather(*(one_session(s, clients[i % len(clients)]) for i, s in enumerate(schedule.sessions)))
        wall = time.monotonic() - t0
    return results, wall


def request_name(session: Session, index: int) -> str:
    """What a request carries in ``user``: unique within a schedule."""
    return f"{session.session_id}#{index}"


async def _one(client: httpx.AsyncClient, body: dict[str, object], headers: dict[str, str], session: Session,
               index: int, t0: float) -> tuple[RequestResult, str]:
    start = time.monotonic()
    chunk_times: list[float] = []
    parts: list[str] = []
    error = None
    response_id = ""
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                error = f"{response.status_code} {(await response.aread())[:200]!r}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        error = str(event["error"])[:200]
                        break
                    response_id = response_id or str(event.get("id") or "")
                    for choice in event.get("choices") or []:
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            chunk_times.append(time.monotonic())
                            parts.append(content)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = time.monotonic()
    ttft = chunk_times[0] - start if chunk_times else None
    itl = (chunk_times[-1] - chunk_times[0]) / (len(chunk_times) - 1) if len(chunk_times) > 1 else None
    if error is None and not chunk_times:
        error = "no content"
    turn = session.turns[index]
    return RequestResult(session.session_id, index, turn.prefix_key, start - t0, ttft, end - start, itl,
                         len(chunk_times), error, user=request_name(session, index), sent_at=start,
                         response_id=response_id), "".join(parts)
