"""The Consul registry backend beyond the shared contract: Meta/KV, ACL, blocking queries, outages, checks, TLS, config.

Everything runs against ``ConsulDouble`` (tests/consul_double.py), a test double of Consul's HTTP API on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel, SecretStr

from litellm_disagg.discovery.cli import add_registry_args, registry_settings_from_args
from litellm_disagg.discovery.consul import codec
from litellm_disagg.discovery.consul.endpoint import ConsulEndpoint
from litellm_disagg.discovery.consul.http import ConsulDenied
from litellm_disagg.discovery.consul.registry import ConsulRegistry
from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.discovery.factory import make_registry
from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.discovery.registry import RegistryError
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole, WorkerState
from litellm_disagg.settings import DisaggSettings

from .consul_double import ConsulDouble, SeenRequest
from .support.registry_watch import WatchCollector, eventually

FAST = dict(wait_s=2.0, min_query_interval_s=0.01, retry_min_s=0.05, retry_max_s=0.2, request_timeout_s=2.0)


def make_config(worker_id: str, **overrides: Any) -> RuntimeConfig:
    fields: dict[str, Any] = dict(
        worker_id=worker_id, model="tiny-model", role=WorkerRole.DECODE, base_url="http://127.0.0.1:8200/v1",
        transfer=VllmNixlTransfer(host="127.0.0.1", port=5601), kv_capacity_blocks=4096, block_size=16,
        state=WorkerState.READY,
        kv_events_endpoint="tcp://127.0.0.1:5557",
    )
    return RuntimeConfig(**(fields | overrides))


def discovery_gauge() -> float | None:
    return REGISTRY.get_sample_value("litellm_disagg_discovery_up")


@pytest.fixture
async def double() -> AsyncIterator[ConsulDouble]:
    async with ConsulDouble() as consul:
        yield consul


@pytest.fixture
async def registries() -> AsyncIterator[Callable[..., ConsulRegistry]]:
    """``make(double, **settings)`` -> a ConsulRegistry with fast test timings (closed after the test)."""
    made: list[ConsulRegistry] = []

    def make(
        consul: ConsulDouble | None = None, *, environ: dict[str, str] | None = None, **settings: Any
    ) -> ConsulRegistry:
        if consul is not None:
            settings.setdefault("address", consul.address)
        registry = ConsulRegistry(ConsulRegistrySettings(**(FAST | settings)), environ=environ or {})
        made.append(registry)
        return registry

    yield make
    for registry in made:
        await registry.close()


# -- Meta limits and the KV fallback ---------------------------------------------------------------------------------

BAD_META = {
    "too many pairs": {f"k{i}": "v" for i in range(65)},
    "dotted key": {"model.name": "x"},
    "long key": {"k" * 129: "x"},
    "long value": {"model": "x" * 513},
    "long multibyte value": {"model": "模" * 200},  # 200 characters, 600 bytes: Consul counts bytes
    "reserved prefix": {"consul-version": "1"},
}


@pytest.mark.parametrize("case", sorted(BAD_META))
async def test_meta_rules_match_what_consul_refuses(case: str, double: ConsulDouble) -> None:
    meta = BAD_META[case]
    assert codec.meta_problem(meta) is not None
    async with httpx.AsyncClient(base_url=double.url, trust_env=False) as client:
        response = await client.put("/v1/agent/service/register", json={"Name": "x", "Meta": meta})
    assert response.status_code == 400
    if case == "dotted key":
        assert "Key contains invalid characters" in response.text


def test_meta_at_the_limits_is_fine() -> None:
    meta = {f"k{i}": "v" * 512 for i in range(63)} | {"k" * 128: "模" * 170}
    assert codec.meta_problem(meta) is None


def test_small_config_round_trips_through_meta() -> None:
    config = make_config("w-1", started_at=1712345678.123456)
    encoded = codec.encode(config, kv_prefix="litellm-disagg/workers")
    assert encoded.kv is None
    assert encoded.meta["kv_capacity_blocks"] == "4096" and encoded.meta["role"] == "decode"
    assert codec.meta_problem(encoded.meta) is None
    assert codec.decode_meta(encoded.meta) == config


def test_the_transfer_section_is_flattened_into_meta() -> None:
    meta = codec.encode(make_config("w-1"), kv_prefix="p").meta
    assert (meta["engine"], meta["transfer_kind"], meta["transfer_host"], meta["transfer_port"]) == (
        "vllm", "vllm-nixl", "127.0.0.1", "5601")
    assert "transfer" not in meta
    bad = meta | {"transfer_port": "0"}
    with pytest.raises(ValueError):
        codec.decode_meta(bad)


# Meta exactly as the 0.1 codec wrote it (top-level nixl_host/nixl_port/backend, no transfer_ keys).
META_0_1 = {
    "worker_id": "w-1", "model": "tiny-model", "role": "decode", "backend": "vllm",
    "base_url": "http://127.0.0.1:8200/v1", "nixl_host": "127.0.0.1", "nixl_port": "5601",
    "kv_capacity_blocks": "4096", "block_size": "16", "kv_events_endpoint": "tcp://127.0.0.1:5557",
    "tensor_parallel_size": "1", "state": "ready", "started_at": "1712345678.5", "version": "0.1.0",
    "ld_format": "meta-1",
}


def test_meta_of_the_0_1_codec_still_reads() -> None:
    assert codec.decode_meta(META_0_1) == make_config("w-1", started_at=1712345678.5, version="0.1.0")
    with pytest.raises(ValueError):
        codec.decode_meta(META_0_1 | {"nixl_port": "none"})


def test_a_0_1_router_reads_new_meta_and_kv_documents() -> None:
    from tests.support.runtime_config_0_1 import RuntimeConfig as RuntimeConfig01

    config = make_config("w-1", started_at=1712345678.5, version="0.1.0")
    meta = codec.encode(config, kv_prefix="p").meta
    def old_decode_meta(meta: dict[str, str]) -> Any:  # the 0.1 codec's: the keys its model knows, validated lax
        return RuntimeConfig01.model_validate({k: v for k, v in meta.items() if k in RuntimeConfig01.model_fields},
                                              strict=False)

    old = old_decode_meta(meta)
    assert old == old_decode_meta(META_0_1)
    big = codec.encode(make_config("w-big", model="模型" * 100), kv_prefix="p")
    assert big.kv is not None
    assert RuntimeConfig01.model_validate_json(big.kv.value).nixl_port == 5601
    legacy_document = json.dumps(old.model_dump(mode="json")).encode()  # a 0.1 worker's KV document
    key = codec.kv_key("p", "w-1", legacy_document)
    assert codec.decode_kv(key, legacy_document) == config


async def test_published_meta_is_flat_strings(double: ConsulDouble, registries: Callable[..., ConsulRegistry]) -> None:
    await registries(double).publish(make_config("w-1"))
    meta = double.agent_service("w-1")["Meta"]  # type: ignore[index]
    assert meta["ld_format"] == "meta-1" and meta["nixl_port"] == "5601" and meta["worker_id"] == "w-1"
    assert "kv_events_endpoint" in meta and double.kv_keys() == []


async def test_large_config_goes_to_kv(double: ConsulDouble, registries: Callable[..., ConsulRegistry]) -> None:
    writer, reader = registries(double), registries(double)
    config = make_config("w-big", model="模型" * 100)  # 200 characters (valid), 600 bytes (too long for Meta)
    await writer.publish(config)

    meta = double.agent_service("w-big")["Meta"]  # type: ignore[index]
    assert meta["ld_format"] == "kv-1"
    assert meta["ld_kv_key"].startswith("litellm-disagg/workers/w-big/")
    assert "model" not in meta and meta["role"] == "decode"  # the short fields that fit, for people
    assert codec.meta_problem(meta) is None
    assert double.kv_keys() == [meta["ld_kv_key"]]
    assert await reader.snapshot() == [config]

    # Every republish writes a new content-addressed document; the current and the previous one are kept.
    for state in (WorkerState.DRAINING, WorkerState.READY, WorkerState.STARTING):
        await writer.publish(config.with_state(state))
    assert len(double.kv_keys("litellm-disagg/workers/w-big/")) == 2
    assert await reader.snapshot() == [config.with_state(WorkerState.STARTING)]

    await writer.withdraw("w-big")
    assert double.kv_keys() == [] and await reader.snapshot() == []


async def test_kv_documents_of_an_earlier_process_are_cleared(
    double: ConsulDouble, registries: Callable[..., ConsulRegistry]
) -> None:
    config = make_config("w-big", model="模型" * 100)
    await registries(double).publish(config.with_state(WorkerState.STARTING))  # a process that then died
    await registries(double).publish(config)
    assert len(double.kv_keys("litellm-disagg/workers/w-big/")) == 1


async def test_kv_document_that_does_not_match_its_digest_is_skipped(
    double: ConsulDouble, registries: Callable[..., ConsulRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    writer, reader = registries(double), registries(double)
    await writer.publish(make_config("w-big", model="模型" * 100))
    key = double.kv_keys()[0]
    forged = make_config("w-big", model="forged").model_dump_json().encode()
    async with httpx.AsyncClient(base_url=double.url, trust_env=False) as client:
        assert (await client.put(f"/v1/kv/{key}", content=forged)).json() is True
    assert await reader.snapshot() == []
    assert "does not match its digest" in caplog.text


async def test_registration_body(double: ConsulDouble, registries: Callable[..., ConsulRegistry]) -> None:
    registry = registries(double, check_ttl_s=7.5, deregister_critical_after_s=90)
    await registry.publish(make_config("w-1", model="HuggingFaceTB/SmolLM2-135M-Instruct", base_url="http://10.1.2.3:8200/v1"))
    body = double.registrations[-1]
    assert body["ID"] == "w-1"
    assert body["Name"] == "litellm-disagg-huggingfacetb-smollm2-135m-instruct"
    assert body["Tags"] == ["litellm-disagg", "decode", "ready"]
    assert (body["Address"], body["Port"]) == ("10.1.2.3", 8200)
    assert body["Check"] == {
        "CheckID": "service:w-1", "Name": "litellm-disagg heartbeat", "TTL": "7500ms", "Status": "passing",
        "DeregisterCriticalServiceAfter": "90s",
    }
    assert double.seen("PUT", "/v1/agent/service/register")[-1].query == {"replace-existing-checks": "true"}


async def test_one_configured_service_name(double: ConsulDouble, registries: Callable[..., ConsulRegistry]) -> None:
    writer, reader = registries(double, service_name="llm-workers"), registries(double, service_name="llm-workers")
    await writer.publish(make_config("w-1", model="a"))
    await writer.publish(make_config("w-2", model="b"))
    assert {r["Name"] for r in double.registrations} == {"llm-workers"}
    assert [c.worker_id for c in await reader.snapshot()] == ["w-1", "w-2"]


def test_service_names_are_dns_friendly() -> None:
    assert codec.service_name_for("Qwen/Qwen2.5-0.5B", "litellm-disagg-") == "litellm-disagg-qwen-qwen2-5-0-5b"
    long = codec.service_name_for("org/" + "very-long-model-name-" * 5, "litellm-disagg-")
    assert len(long) <= 63 and long.startswith("litellm-disagg-org-very-long")
    assert long != codec.service_name_for("org/" + "very-long-model-name-" * 6, "litellm-disagg-")


async def test_foreign_services_are_ignored(
    double: ConsulDouble, registries: Callable[..., ConsulRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    """Only our instances are read: by tag and name prefix; ``consul`` itself and other apps are left alone."""
    registry = registries(double)
    config = make_config("w-1")
    await registry.publish(config)
    async with httpx.AsyncClient(base_url=double.url, trust_env=False) as client:
        await client.put("/v1/agent/service/register", json={"Name": "web", "Tags": ["litellm-disagg"]})
        await client.put("/v1/agent/service/register", json={"Name": "litellm-disagg-x", "ID": "untagged"})
        await client.put("/v1/agent/service/register", json={  # shares our service name, without our tag
            "Name": "litellm-disagg-tiny-model", "ID": "sidecar", "Meta": {"version": "2"}})
    caplog.set_level(logging.WARNING)
    assert await registry.snapshot() == [config]
    assert not double.seen("GET", "/v1/health/service/web") and not double.seen("GET", "/v1/health/service/consul")
    assert not double.seen("GET", "/v1/health/service/litellm-disagg-x")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# -- ACL -------------------------------------------------------------------------------------------------------------


async def test_acl_token_is_sent(registries: Callable[..., ConsulRegistry]) -> None:
    async with ConsulDouble(acl_token="s3cret") as consul:
        registry = registries(consul, token="s3cret")
        await registry.publish(make_config("w-1"))
        await registry.heartbeat("w-1")
        assert [c.worker_id for c in await registry.snapshot()] == ["w-1"]
        await registry.withdraw("w-1")
        assert consul.requests and all(r.headers.get("x-consul-token") == "s3cret" for r in consul.requests)


async def test_unknown_token_is_refused(registries: Callable[..., ConsulRegistry]) -> None:
    async with ConsulDouble(acl_token="s3cret") as consul:
        registry = registries(consul, token="wrong")
        with pytest.raises(RegistryError, match=r"403.*ACL not found") as caught:
            await registry.snapshot()
        assert isinstance(caught.value, ConsulDenied)
        with pytest.raises(RegistryError, match="403"):
            await registry.publish(make_config("w-1"))


async def test_anonymous_writes_are_denied_and_reads_filtered(
    registries: Callable[..., ConsulRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    async with ConsulDouble(acl_token="s3cret") as consul:
        await registries(consul, token="s3cret").publish(make_config("w-1"))
        anonymous = registries(consul)
        with pytest.raises(RegistryError, match=r"403.*Permission denied"):
            await anonymous.publish(make_config("w-2"))
        assert await anonymous.snapshot() == []  # Consul filters listings for the anonymous token
        assert await anonymous.snapshot() == []
        assert caplog.text.count("X-Consul-Results-Filtered-By-ACLs") == 1


# -- blocking queries ------------------------------------------------------------------------------------------------


async def test_watch_uses_blocking_queries(double: ConsulDouble, registries: Callable[..., ConsulRegistry]) -> None:
    writer, reader = registries(double), registries(double, wait_s=1.5)
    await writer.publish(make_config("w-1"))
    watch = WatchCollector(reader)
    try:
        assert [c.worker_id for c in await watch.next()] == ["w-1"]
        await writer.publish(make_config("w-1", state=WorkerState.DRAINING))
        assert (await watch.next())[0].state is WorkerState.DRAINING
    finally:
        await watch.stop()
    for path in ("/v1/catalog/services", "/v1/health/service/litellm-disagg-tiny-model"):
        seen = double.seen("GET", path)
        assert "index" not in seen[0].query  # the first read does not block
        blocking = [r for r in seen if "index" in r.query]
        assert blocking and all(int(r.query["index"]) > 0 and r.query["wait"] == "1500ms" for r in blocking)
    assert all(r.query.get("passing") == "true" for r in double.seen("GET", "/v1/health/service/"))


async def test_index_reset_starts_over(double: ConsulDouble, registries: Callable[..., ConsulRegistry]) -> None:
    writer, reader = registries(double), registries(double, wait_s=1.0)
    await writer.publish(make_config("w-1"))
    watch = WatchCollector(reader)

    def health_reads(since: int = 0) -> list[tuple[int, SeenRequest]]:
        """The reader's health reads from position ``since`` of the double's request log, with their positions."""
        return [(n, r) for n, r in enumerate(double.requests)
                if n >= since and r.method == "GET" and r.path.startswith("/v1/health/service/")]

    try:
        await watch.next()
        await eventually(lambda: any("index" in r.query for _, r in health_reads()))  # blocked on the current index
        high = max(int(r.query["index"]) for _, r in health_reads() if "index" in r.query)
        double.reset_index(to=1)
        mark = len(double.requests)
        # The blocked read's wait ends with X-Consul-Index 1, lower than the index it blocked on: the loop starts
        # over with a read without an index, then blocks on the new index, 1, not on the old one.
        await eventually(lambda: any("index" not in r.query for _, r in health_reads(mark)), timeout_s=10.0)
        restart = next(n for n, r in health_reads(mark) if "index" not in r.query)
        await eventually(lambda: any("index" in r.query for _, r in health_reads(restart)), timeout_s=10.0)
        published = len(double.requests)
        blocked_on = {r.query["index"] for n, r in health_reads(restart) if n < published and "index" in r.query}
        assert high > 1 and blocked_on == {"1"}, f"after the reset the reads must block on 1, not {blocked_on}"
        # A write takes the index past 1, which wakes a read blocked on 1; the loop then follows the new index.
        await writer.publish(make_config("w-2"))
        assert [c.worker_id for c in await watch.next(10.0)] == ["w-1", "w-2"]
        await eventually(lambda: any(int(r.query.get("index", "0")) > 1 for _, r in health_reads(published)),
                         timeout_s=10.0)
    finally:
        await watch.stop()


async def test_zero_index_is_taken_as_one(double: ConsulDouble, registries: Callable[..., ConsulRegistry]) -> None:
    await registries(double).publish(make_config("w-1"))
    double.zero_index = True
    reader = registries(double, wait_s=0.5, min_query_interval_s=0.0)
    watch = WatchCollector(reader)
    try:
        await watch.next()
        mark = len(double.requests)

        def health() -> list[SeenRequest]:
            return [r for r in double.requests[mark:] if r.path.startswith("/v1/health/service/")]

        await eventually(lambda: len(health()) >= 3, timeout_s=10.0)
    finally:
        await watch.stop()
    # Every read after an answer with X-Consul-Index 0 blocks on index 1 (the double holds it for its wait: nothing
    # exceeds 1); a read without an index would return at once, and looping on those would be a tight loop.
    assert all(r.query.get("index") == "1" and r.query.get("wait") == "500ms" for r in health())


async def test_invalid_entry_is_logged_once_across_polls(
    double: ConsulDouble, registries: Callable[..., ConsulRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    writer, reader = registries(double), registries(double)
    async with httpx.AsyncClient(base_url=double.url, trust_env=False) as client:
        await client.put("/v1/agent/service/register", json={
            "ID": "broken", "Name": "litellm-disagg-tiny-model", "Tags": ["litellm-disagg"],
            "Meta": {"ld_format": "meta-1", "worker_id": "broken", "role": "oracle"},
            "Check": {"TTL": "60s", "Status": "passing"},
        })
    caplog.set_level(logging.WARNING)
    watch = WatchCollector(reader)
    try:
        assert await watch.next() == []
        for n in range(3):  # each change re-reads the service, broken entry included
            await writer.publish(make_config(f"w-{n}"))
            await watch.next()
    finally:
        await watch.stop()
    assert sum("'broken'" in r.getMessage() for r in caplog.records) == 1


# -- outages ---------------------------------------------------------------------------------------------------------


async def test_outage_keeps_last_snapshot_and_recovers(
    double: ConsulDouble, registries: Callable[..., ConsulRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    writer, reader = registries(double, check_ttl_s=30), registries(double)
    await writer.publish(make_config("w-1"))
    watch = WatchCollector(reader)
    try:
        assert [c.worker_id for c in await watch.next()] == ["w-1"]
        assert reader.discovery_up and discovery_gauge() == 1.0

        await double.stop()
        await eventually(lambda: not reader.discovery_up)
        assert discovery_gauge() == 0.0
        await asyncio.sleep(0.8)  # many retries meanwhile
        assert watch.queue.empty() and not watch.task.done(), "the watch must neither end nor yield during an outage"
        assert caplog.text.count("consul unreachable, routing on last known workers") == 1
        with pytest.raises(RegistryError):
            await reader.snapshot()

        await double.start()  # same port, same state
        await eventually(lambda: reader.discovery_up)
        assert discovery_gauge() == 1.0
        await writer.publish(make_config("w-2"))
        assert [c.worker_id for c in await watch.next()] == ["w-1", "w-2"]
        assert caplog.text.count("consul reachable again") == 1
        assert caplog.text.count("consul unreachable") == 1
    finally:
        await watch.stop()


async def test_watch_waits_for_consul_that_is_down_at_start(
    double: ConsulDouble, registries: Callable[..., ConsulRegistry]
) -> None:
    await double.stop()
    reader = registries(double)
    with pytest.raises(RegistryError, match="unreachable"):
        await reader.snapshot()
    watch = WatchCollector(reader)
    try:
        await asyncio.sleep(0.5)
        assert watch.queue.empty() and not watch.task.done()
        await double.start()
        assert await watch.next(3.0) == []
    finally:
        await watch.stop()


async def test_heartbeat_registers_again_when_the_agent_lost_it(
    double: ConsulDouble, registries: Callable[..., ConsulRegistry]
) -> None:
    writer, reader = registries(double), registries(double)
    config = make_config("w-1")
    await writer.publish(config)
    await double.restart(lose_agent_state=True)
    assert await reader.snapshot() == []
    await writer.heartbeat("w-1")
    assert await reader.snapshot() == [config]


# -- health checks ---------------------------------------------------------------------------------------------------


async def test_critical_service_is_deregistered_after_the_configured_time(
    registries: Callable[..., ConsulRegistry],
) -> None:
    async with ConsulDouble(reap_interval_s=0.05, min_deregister_critical_s=0.0) as consul:
        registry = registries(consul, check_ttl_s=0.3, heartbeat_interval_s=0.1, deregister_critical_after_s=0.3)
        await registry.publish(make_config("w-1"))
        await eventually(lambda: consul.check_status("service:w-1") == "critical", timeout_s=2.0)
        assert "w-1" in consul.service_ids() and await registry.snapshot() == []  # critical: out of ?passing
        await eventually(lambda: "w-1" not in consul.service_ids(), timeout_s=2.0)


class HealthServer:
    """A worker's ``/health`` endpoint whose status code the test sets."""

    def __init__(self) -> None:
        self.status = 200
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(f"HTTP/1.1 {self.status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()


async def test_http_check_mode(double: ConsulDouble, registries: Callable[..., ConsulRegistry]) -> None:
    health = HealthServer()
    await health.start()
    try:
        writer = registries(double, check="http", check_interval_s=0.1, check_timeout_s=0.5)
        reader = registries(double)
        config = make_config("w-1", base_url=f"http://127.0.0.1:{health.port}/v1")
        await writer.publish(config)
        check = double.registrations[-1]["Check"]
        assert check["HTTP"] == f"http://127.0.0.1:{health.port}/health"
        assert (check["Interval"], check["Timeout"]) == ("100ms", "500ms") and "TTL" not in check
        assert await reader.snapshot() == [config]
        await writer.heartbeat("w-1")  # nothing to pass: the agent polls /health
        assert not double.seen("PUT", "/v1/agent/check/pass/")

        health.status = 503
        await eventually(lambda: double.check_status("service:w-1") == "critical")
        assert await reader.snapshot() == []
        health.status = 200
        await eventually(lambda: double.check_status("service:w-1") == "passing")
        assert await reader.snapshot() == [config]
    finally:
        await health.close()


# -- connection settings ---------------------------------------------------------------------------------------------


def test_defaults_without_environment() -> None:
    endpoint = ConsulEndpoint.resolve(ConsulRegistrySettings(), {})
    assert endpoint.base_url == "http://127.0.0.1:8500" and endpoint.token is None
    assert endpoint.headers() == {} and endpoint.scope_params() == {} and endpoint.ssl_context() is None


def test_environment_variables_are_defaults(tmp_path: Path) -> None:
    env = {
        "CONSUL_HTTP_ADDR": "consul.internal:8501", "CONSUL_HTTP_SSL": "true", "CONSUL_HTTP_TOKEN": "from-env",
        "CONSUL_CACERT": "/etc/consul/ca.pem", "CONSUL_CLIENT_CERT": "/etc/consul/c.pem",
        "CONSUL_CLIENT_KEY": "/etc/consul/c.key", "CONSUL_TLS_SERVER_NAME": "server.dc1.consul",
        "CONSUL_NAMESPACE": "team-a",
    }
    endpoint = ConsulEndpoint.resolve(ConsulRegistrySettings(datacenter="dc2"), env)
    assert endpoint.base_url == "https://consul.internal:8501"
    assert endpoint.headers() == {"X-Consul-Token": "from-env"}
    assert (endpoint.ca_cert, endpoint.client_cert, endpoint.client_key) == (
        "/etc/consul/ca.pem", "/etc/consul/c.pem", "/etc/consul/c.key")
    assert endpoint.request_extensions() == {"sni_hostname": "server.dc1.consul"}
    assert endpoint.scope_params() == {"dc": "dc2", "ns": "team-a"}
    assert endpoint.scope_params(datacenter=False) == {"ns": "team-a"}
    assert "from-env" not in repr(endpoint)

    explicit = ConsulEndpoint.resolve(
        ConsulRegistrySettings(address="http://10.0.0.9:8500", token=SecretStr("explicit"), namespace="team-b"), env)
    assert explicit.base_url == "http://10.0.0.9:8500"  # a scheme in the address beats CONSUL_HTTP_SSL
    assert explicit.token == "explicit" and explicit.namespace == "team-b"
    assert explicit.request_extensions() == {}  # plain http: no TLS server name

    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    with_file = env | {"CONSUL_HTTP_TOKEN_FILE": str(token_file)}
    assert ConsulEndpoint.resolve(ConsulRegistrySettings(), with_file).token == "from-file"  # as Consul's Go client
    unix = ConsulEndpoint.resolve(ConsulRegistrySettings(address="unix:///run/consul.sock"), {})
    assert (unix.uds, unix.base_url) == ("/run/consul.sock", "http://consul")
    assert not ConsulEndpoint.resolve(ConsulRegistrySettings(), env | {"CONSUL_HTTP_SSL_VERIFY": "false"}).verify
    with pytest.raises(ValueError, match="CONSUL_HTTP_SSL"):
        ConsulEndpoint.resolve(ConsulRegistrySettings(), {"CONSUL_HTTP_SSL": "maybe"})


async def test_environment_end_to_end(registries: Callable[..., ConsulRegistry]) -> None:
    async with ConsulDouble(acl_token="env-token") as consul:
        registry = registries(environ={"CONSUL_HTTP_ADDR": consul.address, "CONSUL_HTTP_TOKEN": "env-token"})
        await registry.publish(make_config("w-1"))
        assert [c.worker_id for c in await registry.snapshot()] == ["w-1"]


async def test_datacenter_and_namespace_are_sent(
    double: ConsulDouble, registries: Callable[..., ConsulRegistry]
) -> None:
    registry = registries(double, datacenter="dc1", namespace="team-a")
    await registry.publish(make_config("w-1", model="模型" * 100))  # KV too
    await registry.heartbeat("w-1")
    assert len(await registry.snapshot()) == 1
    for request in double.requests:
        assert request.query.get("ns") == "team-a"
        assert request.query.get("dc") == (None if request.path.startswith("/v1/agent/") else "dc1")
    with pytest.raises(RegistryError, match="No path to datacenter"):
        await registries(double, datacenter="dc9").snapshot()


def test_tls_settings_build_the_ssl_context(tls_files: dict[str, Path]) -> None:
    endpoint = ConsulEndpoint.resolve(ConsulRegistrySettings(
        address="https://127.0.0.1:8501", ca_cert=str(tls_files["ca"]), client_cert=str(tls_files["client_cert"]),
        client_key=str(tls_files["client_key"]), tls_server_name="consul.test"), {})
    context = endpoint.ssl_context()
    assert context is not None
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert any("test consul CA" in str(ca["subject"]) for ca in context.get_ca_certs())
    kwargs = endpoint.client_kwargs(5.0)
    assert kwargs["verify"] is not None and kwargs["trust_env"] is False
    assert endpoint.request_extensions() == {"sni_hostname": "consul.test"}

    insecure = ConsulEndpoint.resolve(
        ConsulRegistrySettings(address="https://127.0.0.1:8501", tls_skip_verify=True), {}
    )
    skip = insecure.ssl_context()
    assert skip is not None and skip.verify_mode is ssl.CERT_NONE and not skip.check_hostname
    with pytest.raises(ValueError, match="client key needs a client certificate"):
        ConsulEndpoint.resolve(ConsulRegistrySettings(address="https://x:1", client_key="k.pem"), {}).ssl_context()


async def test_mutual_tls_end_to_end(tls_files: dict[str, Path], registries: Callable[..., ConsulRegistry]) -> None:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls_files["ca"]))
    server.load_cert_chain(tls_files["server_cert"], tls_files["server_key"])
    server.verify_mode = ssl.CERT_REQUIRED
    async with ConsulDouble(tls=server) as consul:
        tls = dict(address=f"https://{consul.address}", ca_cert=str(tls_files["ca"]))
        client = dict(client_cert=str(tls_files["client_cert"]), client_key=str(tls_files["client_key"]))
        registry = registries(tls_server_name="consul.test", **tls, **client)
        await registry.publish(make_config("w-1"))
        assert [c.worker_id for c in await registry.snapshot()] == ["w-1"]
        with pytest.raises(RegistryError):  # the certificate names consul.test, not 127.0.0.1
            await registries(**tls, **client).snapshot()
        with pytest.raises(RegistryError):  # the server wants a client certificate
            await registries(tls_server_name="consul.test", **tls).snapshot()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for DNS name ``consul.test`` only, and a client certificate (EC keys: fast)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = tmp_path_factory.mktemp("tls")
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> Any:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def issue(subject: str, issuer: str, key: Any, signer: Any, *, ca: bool = False, extra: Sequence[Any] = ()) -> Any:
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                decipher_only=False), critical=True)
            builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        else:
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
        for extension in extra:
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(signer, hashes.SHA256())

    def write(stem: str, cert: Any, key: Any) -> tuple[Path, Path]:
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path

    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca_cert = issue("test consul CA", "test consul CA", ca_key, ca_key, ca=True)
    server_cert = issue("consul.test", "test consul CA", server_key, ca_key, extra=[
        x509.SubjectAlternativeName([x509.DNSName("consul.test")]),
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])])
    client_cert = issue("litellm-disagg", "test consul CA", client_key, ca_key, extra=[
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])])
    ca_path, _ = write("ca", ca_cert, ca_key)
    server_paths, client_paths = write("server", server_cert, server_key), write("client", client_cert, client_key)
    return {"ca": ca_path, "server_cert": server_paths[0], "server_key": server_paths[1],
            "client_cert": client_paths[0], "client_key": client_paths[1]}


# -- settings, factory, command line ---------------------------------------------------------------------------------


def test_settings_choose_the_backend() -> None:
    assert isinstance(DisaggSettings.from_proxy_config({}).registry, FileRegistrySettings)
    legacy = DisaggSettings.from_proxy_config({"litellm_disagg": {"registry": {"path": "/tmp/r"}}})
    assert isinstance(legacy.registry, FileRegistrySettings) and legacy.registry.path == "/tmp/r"
    consul = DisaggSettings.from_proxy_config({"litellm_disagg": {"registry": {
        "backend": "consul", "address": "https://consul:8501", "token": "s3cret", "check": "http"}}}).registry
    assert isinstance(consul, ConsulRegistrySettings) and consul.check == "http"
    assert "s3cret" not in repr(consul) and "s3cret" not in str(consul)
    with pytest.raises(ValueError):
        DisaggSettings.from_proxy_config({"litellm_disagg": {"registry": {"backend": "etcd"}}})
    with pytest.raises(ValueError, match="heartbeat_interval_s"):
        ConsulRegistrySettings(check_ttl_s=1.0, heartbeat_interval_s=1.0)
    with pytest.raises(ValueError):
        ConsulRegistrySettings(path="/tmp/r")  # type: ignore[call-arg]  # file settings are not consul settings


async def test_factory_builds_either_backend(tmp_path: Path) -> None:
    assert isinstance(make_registry(FileRegistrySettings(path=str(tmp_path))), FileRegistry)
    consul = make_registry(ConsulRegistrySettings(address="127.0.0.1:1"))
    assert isinstance(consul, ConsulRegistry)
    await consul.close()


def test_factory_refuses_an_unknown_backend() -> None:
    class Etcd(BaseModel):
        backend: str = "etcd"

    with pytest.raises(ValueError, match="unknown registry backend 'etcd'"):
        make_registry(Etcd())  # type: ignore[arg-type]


def test_a_file_backed_proxy_never_imports_the_consul_backend(tmp_path: Path) -> None:
    """A proxy on the file registry never loads the Consul backend (its HTTP client, watch loops); the discovery gauges
    are every backend's now (docs/observability.md), so they may be there."""
    script = f"""
import sys
from litellm_disagg.discovery.factory import make_registry
from litellm_disagg.settings import DisaggSettings
settings = DisaggSettings.from_proxy_config({{"litellm_disagg": {{"registry": {{"path": {str(tmp_path)!r}}}}}}})
make_registry(settings.registry)
loaded = sorted(m for m in sys.modules if m.startswith("litellm_disagg.discovery."))
print(loaded)
assert "litellm_disagg.discovery.consul.registry" not in sys.modules, loaded
assert "litellm_disagg.discovery.consul.watch" not in sys.modules, loaded
assert "litellm_disagg.discovery.consul.http" not in sys.modules, loaded
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_command_line_flags() -> None:
    parser = argparse.ArgumentParser()
    add_registry_args(parser)
    file_settings = registry_settings_from_args(parser.parse_args(["--registry-dir", "/tmp/r"]))
    assert isinstance(file_settings, FileRegistrySettings) and file_settings.path == "/tmp/r"
    args = parser.parse_args([
        "--registry", "consul", "--consul-addr", "https://consul:8501", "--consul-token", "t0k",
        "--consul-cacert", "ca.pem", "--consul-client-cert", "c.pem", "--consul-client-key", "c.key",
        "--consul-datacenter", "dc2", "--consul-namespace", "team-a",
    ])
    settings = registry_settings_from_args(args)
    assert isinstance(settings, ConsulRegistrySettings)
    assert (settings.address, settings.ca_cert, settings.client_cert, settings.client_key) == (
        "https://consul:8501", "ca.pem", "c.pem", "c.key")
    assert settings.token is not None and settings.token.get_secret_value() == "t0k"
    assert (settings.datacenter, settings.namespace) == ("dc2", "team-a")
    bare = registry_settings_from_args(parser.parse_args(["--registry", "consul"]))
    assert isinstance(bare, ConsulRegistrySettings) and bare.address is None  # left to CONSUL_HTTP_ADDR


def test_meta_values_are_json_numbers_not_python_reprs() -> None:
    meta = codec.encode(make_config("w-1", started_at=1.5e9), kv_prefix="p").meta
    assert json.loads(meta["started_at"]) == 1.5e9 and meta["tensor_parallel_size"] == "1"
