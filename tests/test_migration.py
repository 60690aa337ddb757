"""Request migration through the real LiteLLM proxy on simulated workers in their own processes: ``kill -9`` of a
decode worker under 200 concurrent streams costs no stream, and every answer equals its uninterrupted reference token
for token (the streams on the dead worker continue elsewhere, on the same connection, in the same SSE shape); a decode
worker killed under non-streamed requests costs none either (LiteLLM's retries run them again elsewhere)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.processes import spawn, stop, wait_until

from .support.net import free_port, metric
from .support.procs import MASTER_KEY, ProxyProc, log_tail
from .support.proxy_configs import plugin_only

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MODEL = "sim-model"
STREAMS = 200
MAX_TOKENS = 48
AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


@dataclass
class SimProc:
    """``python -m litellm_disagg.sim`` in a process of its own (so that a crash is a real SIGKILL)."""

    name: str
    prefill: int
    decode: int
    registry_dir: Path
    log_dir: Path
    proc: object = None
    workers: list[str] = field(default_factory=list)

    def start(self) -> SimProc:
        argv = [sys.executable, "-m", "litellm_disagg.sim", "--prefill", str(self.prefill), "--decode", str(self.decode),
                # A survivor must not age out of discovery on a starved machine (10 s); the kills' failover never waits
                # for the dead worker's entry to expire (LiteLLM's retries and the stream migration do not).
                "--name", self.name, "--registry-dir", str(self.registry_dir), "--ttl", "10",
                "--heartbeat-interval", "0.5", "--log-level", "WARNING",
                # Slower than the proxy relays (about 8 tokens/s per stream at this batch): the kill must find streams
                # still generating on the victim, not already buffered in the proxy's sockets.
                "--speedup", "0.25"]
        self.proc = spawn(argv, env=dict(os.environ), log=self.log_dir / f"{self.name}.log")
        return self

    def registered(self) -> list[str]:
        return [c.worker_id for c in asyncio.run(FileRegistry(self.registry_dir).snapshot())
                if c.worker_id.startswith(f"{self.name}-")]

    def wait_ready(self) -> None:
        want = self.prefill + self.decode
        wait_until(lambda: len(self.registered()) == want, timeout_s=60, what=f"{self.name}'s workers",
                   alive=lambda: self.proc.poll() is None)  # type: ignore[attr-defined]
        self.workers = self.registered()

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        self.proc.wait(timeout=10)  # type: ignore[attr-defined]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[ProxyProc, dict[str, SimProc], int]]:
    log_dir = Path(os.environ.get("LITELLM_DISAGG_TEST_LOGS") or tmp_path)
    registry_dir = tmp_path / "registry"
    registry_dir.mkdir()
    metrics_port = free_port()
    config = plugin_only({
        "registry": {"backend": "file", "path": str(registry_dir), "poll_interval_s": 0.2, "ttl_s": 10},
        "sync_interval_s": 0.2,
        "metrics": {"port": metrics_port},
        "migration": {"max_migrations": 3},
    }, router={"num_retries": 2, "timeout": 600})
    config_path = tmp_path / "proxy.yaml"
    config_path.write_text(yaml.safe_dump(config))
    sims = {
        "a": SimProc("sima", 1, 1, registry_dir, log_dir),  # the prefill worker and a decode worker that survive
        "b": SimProc("simb", 0, 1, registry_dir, log_dir),  # killed under streams
        "c": SimProc("simc", 0, 1, registry_dir, log_dir),  # killed under non-streamed requests
    }
    proxy = ProxyProc(registry_dir, log_dir, config=config_path)
    try:
        for s in sims.values():
            s.start()
        for s in sims.values():
            s.wait_ready()
        proxy.start()
        proxy.wait_ready(MODEL)
        yield proxy, sims, metrics_port
    finally:
        proxy.stop()
        for s in sims.values():
            if s.proc is not None:
                stop(s.proc, timeout_s=10)  # type: ignore[arg-type]
        print(log_tail(proxy.log, 40))


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You answer questions about serving."},
            {"role": "user", "content": f"Question {i}: what happens to a stream when its decode worker dies?"}]


async def reference(client: httpx.AsyncClient, worker_url: str, i: int) -> str:
    """The uninterrupted answer, straight from a surviving worker (the simulated model is the same everywhere)."""
    r = await client.post(f"{worker_url}/v1/chat/completions",
                          json={"model": MODEL, "messages": messages(i), "max_tokens": MAX_TOKENS})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


@dataclass
class StreamResult:
    text: str = ""
    chunks: list[dict] = field(default_factory=list)
    error: str | None = None
    done: bool = False


async def stream_one(client: httpx.AsyncClient, i: int, out: StreamResult, progress: list[int]) -> None:
    body = {"model": MODEL, "messages": messages(i), "max_tokens": MAX_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    out.done = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = str(chunk["error"])[:300]
                    return
                out.chunks.append(chunk)
                for choice in chunk.get("choices") or []:
                    out.text += (choice.get("delta") or {}).get("content") or ""
                progress[0] += 1
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"


def worker_url(proxy_registry: Path, worker_id: str) -> str:
    for c in asyncio.run(FileRegistry(proxy_registry).snapshot()):
        if c.worker_id == worker_id:
            return c.server_url
    raise AssertionError(f"{worker_id} is not registered")


async def test_kill_9_of_a_decode_worker_under_200_streams_loses_none(stack) -> None:
    proxy, sims, metrics_port = stack
    survivor = next(w for w in sims["a"].workers if "decode" in w)
    survivor_url = await asyncio.to_thread(worker_url, proxy.registry_dir, survivor)
    limits = httpx.Limits(max_connections=STREAMS + 20, max_keepalive_connections=STREAMS + 20)
    async with httpx.AsyncClient(base_url=proxy.url, timeout=180, limits=limits) as client:
        refs = await asyncio.gather(*(reference(client, survivor_url, i) for i in range(STREAMS)))
        results = [StreamResult() for _ in range(STREAMS)]
        progress = [0]
        tasks = [asyncio.create_task(stream_one(client, i, results[i], progress)) for i in range(STREAMS)]
        # Kill the victim mid-answer (a real SIGKILL of its process: connections reset), once it has generated about
        # a fifth of its share of the tokens (its own counter: the client lags what the workers generated).
        victim_url = await asyncio.to_thread(worker_url, proxy.registry_dir, sims["b"].workers[0])
        while not all(t.done() for t in tasks):
            generated = await asyncio.to_thread(metric, victim_url, "vllm:generation_tokens_total")
            if generated >= STREAMS // 3 * MAX_TOKENS // 5:
                break
            await asyncio.sleep(0.1)
        sims["b"].kill9()
        await asyncio.gather(*tasks)

        failed = [(i, r.error) for i, r in enumerate(results) if r.error or not r.done]
        assert not failed, f"{len(failed)} failed streams, e.g. {failed[:3]}"
        wrong = [i for i, r in enumerate(results) if r.text != refs[i]]
        assert not wrong, f"{len(wrong)} answers differ from their reference, e.g. {results[wrong[0]].text!r} != {refs[wrong[0]]!r}"
        for r in results:  # one SSE answer in chat.completion.chunk shape, whatever served its parts
            assert {c["id"] for c in r.chunks} == {r.chunks[0]["id"]}
            assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in r.chunks)
            assert all("token_ids" not in ch for c in r.chunks for ch in c.get("choices") or [])  # not asked for
            finishes = [ch["finish_reason"] for c in r.chunks for ch in c.get("choices") or [] if ch.get("finish_reason")]
            assert finishes == ["length"]
            usage = [c["usage"] for c in r.chunks if c.get("usage")]
            assert usage and usage[-1]["completion_tokens"] == MAX_TOKENS
        migrated = await asyncio.to_thread(
            metric, f"http://127.0.0.1:{metrics_port}", "litellm_disagg_migrations_total", outcome="migrated"
        )
        assert migrated > 0  # some streams really were on the dead worker

        # Non-streamed: nothing reached the client before the crash, so LiteLLM's retries redo the request elsewhere.
        async def once(i: int) -> str:
            r = await client.post("/v1/chat/completions", headers=AUTH,
                                  json={"model": MODEL, "messages": messages(1000 + i), "max_tokens": MAX_TOKENS})
            assert r.status_code == 200, r.text[:300]
            return r.json()["choices"][0]["message"]["content"]

        calls = [asyncio.create_task(once(i)) for i in range(60)]
        victim_url = await asyncio.to_thread(worker_url, proxy.registry_dir, sims["c"].workers[0])
        before = await asyncio.to_thread(metric, victim_url, "vllm:generation_tokens_total")
        while not all(t.done() for t in calls):
            if await asyncio.to_thread(metric, victim_url, "vllm:generation_tokens_total") >= before + 100:
                break
            await asyncio.sleep(0.1)
        sims["c"].kill9()
        answers = await asyncio.gather(*calls)
        refs2 = await asyncio.gather(*(reference(client, survivor_url, 1000 + i) for i in range(60)))
        assert answers == refs2
