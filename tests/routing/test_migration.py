"""Request migration's core (``routing/migration.py``) on in-process simulated workers, without the proxy: a stream
that breaks after k chunks is finished by another decode worker, equal to the uninterrupted answer, in the first
stream's shape; token ids are removed unless the client asked; the limit and a missing worker end in the stream's own
error. (The same through the real proxy with ``kill -9``: ``tests/test_migration.py``.)"""

from __future__ import annotations

import json
import random

import httpx
import pytest
from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.deployments import deployment_id
from litellm_disagg.routing.migration import Migrator, StreamLedger
from litellm_disagg.routing.migration_settings import MigrationSettings
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import PICKER_PROFILES
from litellm_disagg.routing.pipeline.providers import LoadProvider
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.route_plan import RoutePlanner
from litellm_disagg.sim import SimCluster, SimSettings

MESSAGES = [{"role": "user", "content": "Tell me how a stream survives its worker."}]


async def upstream_chunks(client: httpx.AsyncClient, url: str, body: dict) -> list[dict]:
    out = []
    async with client.stream("POST", f"{url}/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def as_litellm(chunk: dict, worker_id: str) -> ModelResponseStream:
    """A chunk as LiteLLM hands it to the stream hook (token ids kept in the choice, the deployment in hidden params)."""
    choices = []
    for c in chunk["choices"]:
        choice = StreamingChoices(index=0, delta=Delta(content=c["delta"].get("content")), finish_reason=c["finish_reason"])
        if "token_ids" in c:
            choice.token_ids = c["token_ids"]
        choices.append(choice)
    out = ModelResponseStream(id=chunk["id"], created=chunk["created"], model=chunk["model"], choices=choices)
    out._hidden_params = {"model_id": deployment_id(worker_id)}
    return out


class BrokenStream:
    """The first ``k`` chunks, then the connection error LiteLLM re-raises mid-stream."""

    def __init__(self, chunks: list[ModelResponseStream], k: int):
        self.chunks, self.k = chunks, k

    async def __aiter__(self):
        for chunk in self.chunks[: self.k]:
            yield chunk
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


@pytest.fixture
async def cluster(tmp_path):
    async with SimCluster(registry=FileRegistry(tmp_path), settings=SimSettings().with_speedup(100)) as c:
        await c.start(prefill=0, decode=3)
        yield c


def migrator(cluster: SimCluster, **settings) -> tuple[Migrator, FailureCooldown]:
    pool = WorkerPool.of([w.config for w in cluster.workers.values()])
    accounting = Accounting()
    profile = PICKER_PROFILES["least_inflight"]()
    cooldown = FailureCooldown()
    planner = RoutePlanner(provider=LoadProvider(accounting), decode=Pipeline(profile, rng=random.Random(0)),
                           prefill=Pipeline(profile, rng=random.Random(0)), cooldown=cooldown)
    return Migrator(MigrationSettings(**settings), pool=lambda: pool, planner=planner, cooldown=cooldown,
                    accounting=accounting), cooldown


@pytest.mark.parametrize("k", [1, 5, 12])
async def test_a_stream_broken_after_k_chunks_ends_as_the_uninterrupted_answer(cluster, k):
    first, *_ = cluster.workers.values()
    body = {"messages": MESSAGES, "max_tokens": 16, "stream": True}
    async with httpx.AsyncClient(timeout=30) as client:
        reference = await upstream_chunks(client, first.base_url, body)
        raw = await upstream_chunks(client, first.base_url, body | {"return_token_ids": True})
    ref_text = "".join(c["choices"][0]["delta"].get("content") or "" for c in reference if c["choices"])
    m, cooldown = migrator(cluster)
    request = {"messages": MESSAGES, "max_tokens": 16, "stream": True, "litellm_call_id": "call-1",
               "stream_options": {"include_usage": True}, "metadata": {}}
    out = [c async for c in m.resilient(BrokenStream([as_litellm(c, first.worker_id) for c in raw], k), request)]
    await m.aclose()
    text = "".join(ch.delta.content or "" for c in out for ch in c.choices)
    assert text == ref_text
    assert {c.id for c in out} == {raw[0]["id"]} and {c.model for c in out} == {"sim-model"}
    assert all(getattr(ch, "token_ids", None) is None for c in out for ch in c.choices)  # the client did not ask
    assert [ch.finish_reason for c in out for ch in c.choices if ch.finish_reason] == ["length"]
    assert out[-1].usage.completion_tokens == 16 and cooldown.cooling(first.worker_id)


async def test_the_client_asked_for_token_ids_keeps_them(cluster):
    first, *_ = cluster.workers.values()
    async with httpx.AsyncClient(timeout=30) as client:
        raw = await upstream_chunks(client, first.base_url,
                                    {"messages": MESSAGES, "max_tokens": 8, "stream": True, "return_token_ids": True})
    m, _ = migrator(cluster)
    request = {"messages": MESSAGES, "max_tokens": 8, "litellm_call_id": "c", "return_token_ids": True}
    out = [c async for c in m.resilient(BrokenStream([as_litellm(c, first.worker_id) for c in raw], 4), request)]
    await m.aclose()
    ids = [t for c in out for ch in c.choices for t in (getattr(ch, "token_ids", None) or [])]
    assert ids == [t for c in raw for ch in c["choices"] for t in ch.get("token_ids", [])]


async def test_with_migration_off_or_no_other_worker_the_stream_fails_as_before(cluster):
    first, *_ = cluster.workers.values()
    async with httpx.AsyncClient(timeout=30) as client:
        raw = await upstream_chunks(client, first.base_url,
                                    {"messages": MESSAGES, "max_tokens": 8, "stream": True, "return_token_ids": True})
    chunks = [as_litellm(c, first.worker_id) for c in raw]
    request = {"messages": MESSAGES, "max_tokens": 8, "litellm_call_id": "c"}
    m, _ = migrator(cluster, max_migrations=0)
    with pytest.raises(httpx.RemoteProtocolError):
        [c async for c in m.resilient(BrokenStream(chunks, 3), request)]
    await m.aclose()
    for other in list(cluster.workers)[1:]:
        await cluster.crash(other)
    m, _ = migrator(cluster)
    m._pool = lambda: WorkerPool.of([first.config])  # the only decode worker is the dead one
    with pytest.raises(httpx.RemoteProtocolError):
        [c async for c in m.resilient(BrokenStream(chunks, 3), request)]
    await m.aclose()


def test_ledger_reads_what_reached_the_client():
    ledger = StreamLedger.for_request({"litellm_call_id": "x", "stream_options": {"include_usage": True}})
    assert ledger.wants_usage and not ledger.wants_ids
