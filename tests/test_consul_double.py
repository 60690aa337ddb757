"""The Consul test double keeps the Consul semantics the registry tests rely on (see tests/consul_double.py)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from .consul_double import ConsulDouble, parse_go_duration


@pytest.fixture
async def consul() -> AsyncIterator[tuple[ConsulDouble, httpx.AsyncClient]]:
    async with ConsulDouble() as double, httpx.AsyncClient(base_url=double.url, trust_env=False) as client:
        yield double, client


def test_go_durations() -> None:
    assert parse_go_duration("10s") == 10 and parse_go_duration("1m30s") == 90
    assert parse_go_duration("250ms") == pytest.approx(0.25) and parse_go_duration("1.5h") == 5400


async def test_kv_values_indexes_and_cas(consul: tuple[ConsulDouble, httpx.AsyncClient]) -> None:
    _, client = consul
    missing = await client.get("/v1/kv/app/a")
    assert missing.status_code == 404 and int(missing.headers["X-Consul-Index"]) >= 1
    assert (await client.put("/v1/kv/app/a", content=b"one")).json() is True
    [entry] = (await client.get("/v1/kv/app/a")).json()
    assert base64.b64decode(entry["Value"]) == b"one" and entry["CreateIndex"] == entry["ModifyIndex"]
    assert (await client.put("/v1/kv/app/a?cas=0", content=b"x")).json() is False  # 0: create only
    assert (await client.put(f"/v1/kv/app/a?cas={entry['ModifyIndex'] + 99}", content=b"x")).json() is False
    assert (await client.put(f"/v1/kv/app/a?cas={entry['ModifyIndex']}", content=b"two")).json() is True
    [updated] = (await client.get("/v1/kv/app/a")).json()
    assert updated["ModifyIndex"] > entry["ModifyIndex"] and updated["CreateIndex"] == entry["CreateIndex"]
    assert (await client.get("/v1/kv/app/a?raw")).content == b"two"
    too_big = await client.put("/v1/kv/app/big", content=b"x" * (512 * 1024 + 1))
    assert too_big.status_code == 413


async def test_kv_recurse_keys_and_delete(consul: tuple[ConsulDouble, httpx.AsyncClient]) -> None:
    _, client = consul
    for key in ("w/1/a", "w/1/b", "w/10/a", "other"):
        await client.put(f"/v1/kv/{key}", content=key.encode())
    assert [e["Key"] for e in (await client.get("/v1/kv/w/1/?recurse")).json()] == ["w/1/a", "w/1/b"]
    assert (await client.get("/v1/kv/w/?keys&separator=/")).json() == ["w/1/", "w/10/"]
    assert (await client.delete("/v1/kv/w/1/?recurse")).json() is True
    assert (await client.get("/v1/kv/w/1/?recurse")).status_code == 404
    assert (await client.get("/v1/kv/w/10/a")).status_code == 200


async def test_blocking_kv_read_waits_for_a_change(consul: tuple[ConsulDouble, httpx.AsyncClient]) -> None:
    _, client = consul
    await client.put("/v1/kv/k", content=b"1")
    index = (await client.get("/v1/kv/k")).headers["X-Consul-Index"]
    started = time.monotonic()
    timed_out = await client.get(f"/v1/kv/k?index={index}&wait=300ms")
    assert time.monotonic() - started > 0.25 and timed_out.headers["X-Consul-Index"] == index  # it waited

    async def write_later() -> None:
        await asyncio.sleep(0.2)
        async with httpx.AsyncClient(base_url=client.base_url, trust_env=False) as other:
            await other.put("/v1/kv/k", content=b"2")

    writer = asyncio.create_task(write_later())
    # A read that timed out would answer with the old index (above); a new index means the write woke it.
    changed = await client.get(f"/v1/kv/k?index={index}&wait=120s", timeout=150)
    await writer
    assert int(changed.headers["X-Consul-Index"]) > int(index)
    assert base64.b64decode(changed.json()[0]["Value"]) == b"2"


async def test_ttl_check_and_passing_filter(consul: tuple[ConsulDouble, httpx.AsyncClient]) -> None:
    double, client = consul
    await client.put("/v1/agent/service/register", json={"Name": "svc", "ID": "s1", "Check": {"TTL": "300ms"}})
    assert double.check_status("service:s1") == "critical"  # a check starts critical unless told otherwise
    assert (await client.get("/v1/health/service/svc?passing")).json() == []
    assert len((await client.get("/v1/health/service/svc")).json()) == 1
    assert (await client.put("/v1/agent/check/pass/service:s1")).status_code == 200
    [entry] = (await client.get("/v1/health/service/svc?passing=true")).json()
    assert entry["Service"]["ID"] == "s1" and {c["CheckID"] for c in entry["Checks"]} == {"serfHealth", "service:s1"}
    await asyncio.sleep(0.45)
    assert (await client.get("/v1/health/service/svc?passing")).json() == []
    assert (await client.put("/v1/agent/check/pass/nope")).status_code == 404
    assert (await client.put("/v1/agent/service/deregister/nope")).status_code == 404
    assert (await client.put("/v1/agent/service/deregister/s1")).status_code == 200
    assert "svc" not in (await client.get("/v1/catalog/services")).json()


async def test_indexes_only_grow_until_reset(consul: tuple[ConsulDouble, httpx.AsyncClient]) -> None:
    double, client = consul
    seen = []
    for n in range(3):
        await client.put("/v1/agent/service/register", json={"Name": "svc", "ID": f"s{n}"})
        seen.append(int((await client.get("/v1/catalog/services")).headers["X-Consul-Index"]))
    assert seen == sorted(seen) and len(set(seen)) == 3
    double.reset_index(1)
    assert int((await client.get("/v1/catalog/services")).headers["X-Consul-Index"]) == 1


async def test_acl() -> None:
    async with ConsulDouble(acl_token="t") as double, httpx.AsyncClient(base_url=double.url, trust_env=False) as client:
        register = {"Name": "svc"}
        assert (await client.put("/v1/agent/service/register", json=register)).status_code == 403
        bad = await client.put("/v1/agent/service/register", json=register, headers={"X-Consul-Token": "x"})
        assert bad.status_code == 403 and bad.text == "ACL not found"
        ok = await client.put("/v1/agent/service/register", json=register, headers={"Authorization": "Bearer t"})
        assert ok.status_code == 200
        anonymous = await client.get("/v1/catalog/services")
        assert anonymous.json() == {} and anonymous.headers["X-Consul-Results-Filtered-By-ACLs"] == "true"
        assert "svc" in (await client.get("/v1/catalog/services?token=t")).json()
