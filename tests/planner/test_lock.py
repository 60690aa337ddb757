"""Only one planner acts: the file lock (fcntl) and the Consul session lock (against the Consul double)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from litellm_disagg.discovery.consul.endpoint import ConsulEndpoint
from litellm_disagg.discovery.consul.http import ConsulHttp
from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.planner.lock import CONSUL_LOCK_KEY, LOCK_FILE, ConsulSessionLock, FileLock, make_lock
from litellm_disagg.planner.settings import PlannerLockSettings
from tests.consul_double import ConsulDouble

HOLD_LOCK = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from litellm_disagg.planner.lock import FileLock

    async def main() -> None:
        lock = FileLock(Path(sys.argv[1]))
        assert await lock.acquire()
        print("held", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


async def test_file_lock_one_holder_then_takeover_after_release(tmp_path: Path) -> None:
    a, b = FileLock(tmp_path / LOCK_FILE), FileLock(tmp_path / LOCK_FILE)
    assert await a.acquire()
    assert await a.acquire()          # holding: stays held
    assert not await b.acquire()
    await a.release()
    assert await b.acquire()
    assert not await a.acquire()
    await b.release()


async def test_file_lock_holder_killed_the_other_takes_over(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    root = Path(__file__).parents[2]  # the repository (no I/O: __file__ is absolute)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdout=subprocess.PIPE,  # noqa: ASYNC220
                              text=True, cwd=root)
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 60)
        assert line.strip() == "held"
        other = FileLock(path)
        assert not await other.acquire()
        os.kill(holder.pid, signal.SIGKILL)   # dies without releasing
        await asyncio.to_thread(holder.wait, 30)
        assert await other.acquire()
        await other.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_make_lock_follows_the_registry_backend(tmp_path: Path) -> None:
    lock = make_lock(FileRegistrySettings(path=str(tmp_path)), PlannerLockSettings())
    assert isinstance(lock, FileLock) and lock.path == tmp_path / LOCK_FILE
    consul = make_lock(ConsulRegistrySettings(address="127.0.0.1:8500"), PlannerLockSettings(ttl_s=20))
    assert isinstance(consul, ConsulSessionLock) and consul.ttl_s == 20


def _http(consul: ConsulDouble) -> ConsulHttp:
    endpoint = ConsulEndpoint.resolve(ConsulRegistrySettings(address=consul.address), environ={})
    return ConsulHttp(endpoint, timeout_s=5.0)


async def test_consul_lock_one_holder_release_and_takeover() -> None:
    async with ConsulDouble() as consul:
        a = ConsulSessionLock(_http(consul), ttl_s=10, own_http=True)
        b = ConsulSessionLock(_http(consul), ttl_s=10, own_http=True)
        assert await a.acquire()
        assert await a.acquire()      # renews and keeps it
        assert not await b.acquire()
        renewals = [r for r in consul.requests if r.path.startswith("/v1/session/renew/")]
        assert renewals, "a holder renews its session on every acquire"
        await a.release()
        assert await b.acquire()
        assert not await a.acquire()
        await b.release()
        await a.release()


async def test_consul_lock_holder_dies_session_ttl_expires_the_other_takes_over() -> None:
    async with ConsulDouble(min_session_ttl_s=0.5) as consul:
        # 3 s: the holder's session outlives the next line even on a loaded machine (0.5 s expired there)
        dead = ConsulSessionLock(_http(consul), ttl_s=3.0, own_http=True)
        live = ConsulSessionLock(_http(consul), ttl_s=3.0, own_http=True)
        assert await dead.acquire()
        assert not await live.acquire()
        # the holder dies: it never renews again. Consul invalidates its session after the TTL and frees the key.
        for _ in range(600):
            if await live.acquire():
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the other planner never took the lock over")
        assert dead.session not in consul._sessions
        # the dead holder, were it to come back, finds its session gone and cannot act
        assert not await dead.acquire()
        await live.release()
        await dead.release()


async def test_consul_double_sessions_follow_consul() -> None:
    async with ConsulDouble() as consul:
        async with _Client(consul) as http:
            short = await http.put("/v1/session/create", json={"TTL": "5s"})
            assert short.status_code == 400 and "Invalid Session TTL" in short.text
            sid = (await http.put("/v1/session/create", json={"TTL": "10s", "LockDelay": "0s"})).json()["ID"]
            assert (await http.put(f"/v1/kv/{CONSUL_LOCK_KEY}", params={"acquire": "nope"})).status_code == 500
            assert (await http.put(f"/v1/kv/{CONSUL_LOCK_KEY}", params={"acquire": sid}, content=b"x")).json() is True
            entry = (await http.get(f"/v1/kv/{CONSUL_LOCK_KEY}")).json()[0]
            assert entry["Session"] == sid and entry["LockIndex"] == 1
            other = (await http.put("/v1/session/create", json={"TTL": "10s"})).json()["ID"]
            assert (await http.put(f"/v1/kv/{CONSUL_LOCK_KEY}", params={"acquire": other})).json() is False
            assert (await http.put(f"/v1/kv/{CONSUL_LOCK_KEY}", params={"release": other})).json() is False
            assert (await http.put(f"/v1/session/destroy/{sid}")).json() is True
            assert (await http.put(f"/v1/session/renew/{sid}")).status_code == 404
            entry = (await http.get(f"/v1/kv/{CONSUL_LOCK_KEY}")).json()[0]
            assert "Session" not in entry
            assert (await http.put(f"/v1/kv/{CONSUL_LOCK_KEY}", params={"acquire": other})).json() is True
            assert (await http.get(f"/v1/kv/{CONSUL_LOCK_KEY}")).json()[0]["LockIndex"] == 2


class _Client:
    def __init__(self, consul: ConsulDouble):
        import httpx

        self._client = httpx.AsyncClient(base_url=consul.url, trust_env=False)

    async def __aenter__(self):  # type: ignore[no-untyped-def]
        return self._client

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()
