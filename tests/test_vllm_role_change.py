"""Role change on real vLLM CPU workers (docs/role-change.md). One module, one set of three workers:

- ``both``: launched ``--role prefill --switchable`` (NixlConnector ``kv_both``), in the proxy's registry;
- ``consumer``: launched ``--role decode`` (``kv_consumer``), in the proxy's registry;
- ``producer``: launched ``--role prefill`` (``kv_producer``), in a registry of its own (the proxy never sees it);

and the real LiteLLM proxy (the shipped ``proxy_config.yaml``, every prompt prefilled remotely) on the first registry.

First the proof of what each KV role can serve (every ordered pair of workers as prefill -> decode, plus each alone),
then a worker changing pool under traffic through the real LiteLLM proxy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import subprocess
import sys
import time

import httpx
import openai
import pytest

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.processes import wait_until
from litellm_disagg.runtime_config import WorkerRole

from .support.procs import MASTER_KEY, ProxyProc, WorkerProc, registered, role_of
from .support.proxy_configs import shipped_with_remote_prefill
from .support.vllm_counters import (
    external_tokens,
    generated_tokens,
    generations_served,
    prefills_served,
    requests_in_engine,
)

pytestmark = pytest.mark.vllm



class Workers:
    def __init__(self, tiny_model, tmp_path_factory):
        base = tmp_path_factory.mktemp("roles")
        self.model = tiny_model
        self.registry = base / "registry"
        self.logs = base
        self.both = WorkerProc("prefill", tiny_model, self.registry, base, wrapper_args=["--switchable"])
        self.consumer = WorkerProc("decode", tiny_model, self.registry, base)
        self.producer = WorkerProc("prefill", tiny_model, base / "side-registry", base)
        # Every prompt prefilled remotely (``mode: always``): the subject is which pool a worker serves in, and the
        # shipped ``auto`` decision prefills these short prompts on the decode worker (seen: five in a row).
        self.proxy = ProxyProc(self.registry, base, config=shipped_with_remote_prefill(base, model="tiny", model_dir=tiny_model))

    @property
    def all(self) -> dict[str, WorkerProc]:
        return {"kv_both": self.both, "kv_consumer": self.consumer, "kv_producer": self.producer}

    def start(self) -> None:
        for worker in self.all.values():
            worker.start()
        self.proxy.start()  # at the same time: on a busy 2-core machine each start takes minutes
        for worker in self.all.values():
            worker.wait_ready(timeout_s=600)
        self.proxy.wait_ready("tiny", timeout_s=600)

    def stop(self) -> None:
        self.proxy.stop()
        for worker in self.all.values():
            worker.kill()


@pytest.fixture(scope="module")
def workers(tiny_model, tmp_path_factory):
    w = Workers(tiny_model, tmp_path_factory)
    try:
        w.start()
        yield w
    finally:
        w.stop()


def complete(worker: WorkerProc, prompt: str, *, max_tokens: int, params: dict | None = None, rid: str | None = None) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if params is not None:
        body["kv_transfer_params"] = params
    headers = {"X-Request-Id": rid} if rid else {}
    r = httpx.post(f"{worker.url}/v1/completions", json=body, headers=headers, timeout=120)
    r.raise_for_status()
    return r.json()


def _prompt(tag: str) -> str:
    return f"Role proof {tag}: " + "the quick brown fox jumps over the lazy dog " * 12


@pytest.mark.parametrize("kv_role", ["kv_both", "kv_consumer", "kv_producer"])
def test_every_kv_role_serves_an_aggregated_request(workers, kv_role):
    reply = complete(workers.all[kv_role], _prompt(f"alone {kv_role}"), max_tokens=8)
    assert reply["choices"][0]["text"]


PAIRS = list(itertools.permutations(["kv_both", "kv_consumer", "kv_producer"], 2))


@pytest.mark.parametrize(("prefill_role", "decode_role"), PAIRS, ids=[f"{p}->{d}" for p, d in PAIRS])
def test_every_kv_role_prefills_for_and_decodes_from_every_other(workers, prefill_role, decode_role):
    """A prefill-style request (do_remote_decode) on one launch, the decode-style request (do_remote_prefill, pulling
    the KV over NIXL) on another: the output equals the third worker's aggregated greedy output, and the decode
    worker's prompt came by transfer."""
    prefill, decode = workers.all[prefill_role], workers.all[decode_role]
    (third,) = [w for r, w in workers.all.items() if r not in (prefill_role, decode_role)]
    prompt = _prompt(f"{prefill_role}->{decode_role}")
    reference = complete(third, prompt, max_tokens=16)["choices"][0]["text"]

    rid = f"role-proof-{prefill_role}-{decode_role}"
    first = complete(prefill, prompt, max_tokens=1, params={"do_remote_decode": True}, rid=rid)
    params = first.get("kv_transfer_params")
    assert params and params.get("do_remote_prefill") and params.get("remote_block_ids"), first
    before = external_tokens(decode)
    reply = complete(decode, prompt, max_tokens=16, params=params, rid=rid)
    assert reply["choices"][0]["text"] == reference
    # The prompt came over NIXL. vLLM's /metrics can trail the answer (a fresh-clone CI run read 0 right after it),
    # so wait for the counter rather than read it once.
    wanted = reply["usage"]["prompt_tokens"] - 1
    for _ in range(120):
        if external_tokens(decode) - before >= wanted:
            break
        time.sleep(0.25)
    assert external_tokens(decode) - before >= wanted


# -- a worker changes pool under traffic through the real proxy ------------------------------------------------------

@pytest.fixture(scope="module")
def proxy(workers):
    return workers.proxy


def _chat(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Flip {i}: tell me about pools of workers. " * 6}]


def _references(workers: Workers, n: int, offset: int, max_tokens: int = 128) -> list[str]:
    """Aggregated greedy outputs from the producer, which the proxy never sees."""
    direct = openai.OpenAI(base_url=f"{workers.producer.url}/v1", api_key="none", max_retries=0, timeout=120)
    return [direct.chat.completions.create(model="tiny", messages=_chat(offset + i), max_tokens=max_tokens, temperature=0)
            .choices[0].message.content for i in range(n)]


def _flow_while(proxy: ProxyProc, workers: Workers, n: int, offset: int, flip) -> list[str]:
    """``n`` requests through the proxy at once; ``flip()`` runs once they have reached the workers: seen in an engine
    (running or waiting), or already generating (a quiet machine can finish all of them between two polls of the
    gauges, which then never show them)."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=MASTER_KEY, max_retries=0, timeout=180)

    def ask(i: int) -> str:
        reply = client.chat.completions.create(model="tiny", messages=_chat(offset + i), max_tokens=128, temperature=0)
        return reply.choices[0].message.content

    serving = (workers.both, workers.consumer)
    generated = sum(generated_tokens(w) for w in serving)

    def reached() -> bool:
        return any(requests_in_engine(w) > 0 for w in serving) or sum(generated_tokens(w) for w in serving) > generated

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(ask, i) for i in range(n)]
        wait_until(reached, timeout_s=120, interval_s=0.05, what="requests in flight")
        flip()
        return [f.result() for f in futures]  # a failed request raises here


def _move_to(workers: Workers, role: WorkerRole, timeout_s: float = 60) -> None:
    """The planner's call (``Registry.request_role``), then the switchable worker publishing ``role``."""
    asyncio.run(FileRegistry(workers.registry).request_role(workers.both.worker_id, role))
    wait_until(lambda: _published_role(workers) is role, timeout_s=timeout_s, interval_s=0.05,
               what=f"the worker to publish {role.value}")


def _published_role(workers: Workers) -> WorkerRole | None:
    config = registered(workers.registry, workers.both.worker_id)
    return config.role if config is not None else None


def test_a_prefill_worker_becomes_a_decode_worker_under_traffic(workers, proxy):
    """Planner's call (Registry.request_role) while 8 requests flow: none fails, all equal the aggregated greedy
    output, and the worker then serves decodes."""
    references = _references(workers, 8, offset=0)
    generated = generations_served(workers.both)

    def flip() -> None:
        _move_to(workers, WorkerRole.DECODE, timeout_s=120)  # drain, settle, republish: 8 streams on 2 cores

    assert _flow_while(proxy, workers, 8, 0, flip) == references
    # The new role's work lands on it: with two decode workers, some of a few more requests are generated there.
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=MASTER_KEY, max_retries=0, timeout=120)
    wait_until(lambda: bool(client.chat.completions.create(model="tiny", messages=_chat(99), max_tokens=4))
               and generations_served(workers.both) > generated, timeout_s=120, interval_s=0.1,
               what="a decode on the flipped worker")


def test_the_role_command_moves_it_back_to_prefill_under_traffic(workers, proxy):
    """``litellm-disagg role WORKER prefill`` while 8 requests flow: none fails, outputs equal, and the worker then
    prefills for the decode worker (the KV arrives there by transfer)."""
    if _published_role(workers) is not WorkerRole.DECODE:  # where the test above leaves it, unless it failed there
        _move_to(workers, WorkerRole.DECODE)
    references = _references(workers, 8, offset=100)
    result: list[subprocess.CompletedProcess[str]] = []

    def flip() -> None:
        result.append(subprocess.run(
            [sys.executable, "-m", "litellm_disagg.cli", "role", workers.both.worker_id, "prefill",
             "--registry-dir", str(workers.registry), "--timeout", "60"],
            capture_output=True, text=True, timeout=120,
        ))

    assert _flow_while(proxy, workers, 8, 100, flip) == references
    (done,) = result
    assert done.returncode == 0, done.stderr
    assert "decode -> prefill requested" in done.stdout and "now prefill" in done.stdout
    # Published (the command saw it), and read until discovery lists the entry (a starved heartbeat can lapse it).
    wait_until(lambda: _published_role(workers) is WorkerRole.PREFILL, timeout_s=60, interval_s=0.1,
               what="the worker published as prefill")
    # The new role's work lands on it. The proxy learns the role from its registry watcher (one poll behind the
    # command's "now prefill"), and vLLM's /metrics can trail an answer: ask up to five requests, each equal to its
    # reference, until one was prefilled there and its KV reached the decode worker by transfer.
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=MASTER_KEY, max_retries=0, timeout=120)
    for attempt in range(5):
        prefilled, pulled = prefills_served(workers.both), external_tokens(workers.consumer)
        reply = client.chat.completions.create(model="tiny", messages=_chat(200 + attempt), max_tokens=8, temperature=0)
        assert reply.choices[0].message.content == _references(workers, 1, offset=200 + attempt, max_tokens=8)[0]
        wanted = reply.usage.prompt_tokens - 1
        for _ in range(40):
            if prefills_served(workers.both) > prefilled and external_tokens(workers.consumer) - pulled >= wanted:
                return
            time.sleep(0.25)
    pytest.fail("five requests after the flip: none was prefilled on the flipped worker with its KV pulled by transfer")


def test_a_role_the_launch_cannot_serve_is_refused(workers):
    done = subprocess.run(
        [sys.executable, "-m", "litellm_disagg.cli", "role", workers.consumer.worker_id, "prefill",
         "--registry-dir", str(workers.registry)], capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2 and "--switchable" in done.stderr
    wait_until(lambda: role_of(workers.registry, workers.consumer.worker_id) is WorkerRole.DECODE, timeout_s=120,
               interval_s=0.1, what="the refused worker still published as decode")
