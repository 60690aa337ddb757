"""Role change through the real LiteLLM proxy over simulated workers (docs/role-change.md): switchable workers flip
decode -> prefill and prefill -> decode while requests flow; no request fails, every answer equals the aggregated one,
and the new role's work lands on the flipped worker. Also ``litellm-disagg role``, the operator command."""

from __future__ import annotations

import asyncio
import sys

import httpx
import pytest
import yaml

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.planner.hook import DesiredHook, HookCall
from litellm_disagg.planner.policy import DesiredPools
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster
from litellm_disagg.sim.worker import SimWorkerState

from ..support.procs import MASTER_KEY, ProxyProc
from ..support.proxy_configs import plugin_only
from ..support.registry_watch import eventually
from .conftest import fast_settings, metric

SYSTEM = {"role": "system", "content": "You are a simulated model answering about pools that change. " * 6}
EXTERNAL = "vllm:prompt_tokens_by_source_total"


def proxy_config(registry_dir) -> dict:
    return plugin_only({
        "registry": {"backend": "file", "path": str(registry_dir), "poll_interval_s": 0.1},
        "sync_interval_s": 0.2,
    }, router={"num_retries": 0, "timeout": 60})


def messages(i: int) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": f"Question {i}: which pool am I in?"}]


class Traffic:
    """Steady load: ``concurrency`` loops each sending one chat after another until stopped; every answer is
    compared with the aggregated answer of a reference worker, straight to it."""

    def __init__(self, proxy: httpx.AsyncClient, reference_url: str, concurrency: int = 4):
        self.proxy = proxy
        self.reference_url = reference_url
        self.sent = 0
        self.failures: list[str] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._loop(n)) for n in range(concurrency)]

    async def _loop(self, n: int) -> None:
        i = n * 100_000
        while not self._stop.is_set():
            i += 1
            body = {"model": "sim-model", "messages": messages(i), "max_tokens": 8}
            r = await self.proxy.post("/v1/chat/completions", json=body)
            self.sent += 1
            if r.status_code != 200:
                self.failures.append(f"{r.status_code}: {r.text[:200]}")
                continue
            ref = await self.proxy.post(f"{self.reference_url}/chat/completions", json={"messages": messages(i), "max_tokens": 8})
            if r.json()["choices"][0]["message"]["content"] != ref.json()["choices"][0]["message"]["content"]:
                self.failures.append(f"request {i}: answer differs from the aggregated one")

    async def at_least(self, more: int) -> None:
        target = self.sent + more
        await eventually(lambda: self.sent >= target or bool(self.failures), timeout_s=180)

    async def until(self, landed, most: int, step: int = 8) -> bool:
        """Send requests ``step`` at a time until ``landed()`` (an async check) holds, at most ``most`` more
        requests: where new work goes is the selection's choice among the pool, so the test waits for the work to
        land by a request count, never by a clock."""
        target = self.sent + most
        while self.sent < target and not self.failures:
            await self.at_least(step)
            if await landed():
                return True
        return False

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def test_workers_change_pool_under_steady_traffic_through_the_proxy(tmp_path):
    registry_dir = tmp_path / "registry"
    config_path = tmp_path / "proxy.yaml"
    config_path.write_text(yaml.safe_dump(proxy_config(registry_dir)))
    planner = FileRegistry(registry_dir, poll_interval_s=0.05)
    async with SimCluster(registry=FileRegistry(registry_dir, poll_interval_s=0.05), settings=fast_settings(),
                          heartbeat_interval_s=0.2, name="sim-roles") as cluster:
        flip_p = await cluster.add(WorkerRole.PREFILL, switchable=True, worker_id="flip-p")
        fixed_d = await cluster.add(WorkerRole.DECODE, worker_id="fixed-d")
        flip_d = await cluster.add(WorkerRole.DECODE, switchable=True, worker_id="flip-d")
        proxy = ProxyProc(registry_dir, tmp_path, config=config_path).start()
        try:
            await asyncio.to_thread(proxy.wait_ready, "sim-model", 180)
            headers = {"Authorization": f"Bearer {MASTER_KEY}"}
            async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=60) as c:
                traffic = Traffic(c, fixed_d.base_url)
                try:
                    await traffic.at_least(8)

                    # decode -> prefill: flip-d leaves the decode pool and prefills (it is no deployment any more, so
                    # what it finishes once its last decodes are done is prefill work).
                    await planner.request_role("flip-d", WorkerRole.PREFILL)
                    await eventually(lambda: flip_d.role is WorkerRole.PREFILL, timeout_s=30)
                    await traffic.at_least(8)
                    baseline = flip_d.engine.stats.finished

                    async def prefilled() -> bool:
                        return flip_d.engine.stats.finished > baseline

                    assert await traffic.until(prefilled, most=160), "no prefill landed on the flipped worker"

                    # prefill -> decode: flip-p joins the decode pool and pulls KV from the prefill workers.
                    pulled = await metric(c, flip_p, EXTERNAL, source="external_kv_transfer")
                    await planner.request_role("flip-p", WorkerRole.DECODE)
                    await eventually(lambda: flip_p.role is WorkerRole.DECODE, timeout_s=30)

                    async def decoded() -> bool:
                        return await metric(c, flip_p, EXTERNAL, source="external_kv_transfer") > pulled

                    assert await traffic.until(decoded, most=160), "no decode landed on the flipped worker"
                    await traffic.at_least(8)  # and requests go on flowing over the new pools
                finally:
                    await traffic.stop()
                assert traffic.failures == [], traffic.failures[:5]
                assert traffic.sent >= 40
                published = {w.worker_id: w.role for w in await planner.snapshot()}
                assert published == {"flip-p": WorkerRole.DECODE, "fixed-d": WorkerRole.DECODE,
                                     "flip-d": WorkerRole.PREFILL}
        finally:
            await asyncio.to_thread(proxy.stop)
            await planner.close()


async def role_command(registry_dir, *args: str) -> tuple[int, str, str]:
    return await operator_command("role", registry_dir, *args)


async def drain_command(registry_dir, *args: str) -> tuple[int, str, str]:
    return await operator_command("drain", registry_dir, *args)


async def operator_command(command: str, registry_dir, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "litellm_disagg.cli", command, *args, "--registry-dir", str(registry_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_role_command_moves_a_worker_and_refuses_what_cannot_be(tmp_path):
    registry_dir = tmp_path / "registry"
    async with SimCluster(registry=FileRegistry(registry_dir, poll_interval_s=0.05), settings=fast_settings(),
                          heartbeat_interval_s=0.2, name="sim-cli") as cluster:
        worker = await cluster.add(WorkerRole.PREFILL, switchable=True, worker_id="w-switch")
        await cluster.add(WorkerRole.DECODE, worker_id="w-fixed")

        code, out, err = await role_command(registry_dir, "w-switch", "decode")
        assert code == 0, err
        assert "w-switch: prefill -> decode requested" in out and "now decode" in out
        assert worker.role is WorkerRole.DECODE

        code, out, err = await role_command(registry_dir, "w-switch", "decode")
        assert code == 0 and "already decode" in out

        code, _, err = await role_command(registry_dir, "w-fixed", "prefill")
        assert code == 2 and "cannot serve role 'prefill'" in err and "--switchable" in err

        code, _, err = await role_command(registry_dir, "no-such-worker", "prefill")
        assert code == 2 and "no live worker 'no-such-worker'" in err


async def test_drain_command_takes_a_worker_out_of_discovery_and_refuses_an_unknown_one(tmp_path):
    registry_dir = tmp_path / "registry"
    async with SimCluster(registry=FileRegistry(registry_dir, poll_interval_s=0.05), settings=fast_settings(),
                          heartbeat_interval_s=0.2, name="sim-drain") as cluster:
        leaving = await cluster.add(WorkerRole.DECODE, worker_id="w-leaving")
        staying = await cluster.add(WorkerRole.DECODE, worker_id="w-staying")

        code, out, err = await drain_command(registry_dir, "w-leaving")
        assert code == 0, err
        assert "w-leaving: drain requested" in out and "left discovery" in out
        await eventually(lambda: leaving.state is SimWorkerState.STOPPED, timeout_s=30)
        assert staying.state is SimWorkerState.READY
        reader = FileRegistry(registry_dir)
        try:
            assert {w.worker_id for w in await reader.snapshot()} == {"w-staying"}
        finally:
            await reader.close()

        code, out, err = await drain_command(registry_dir, "w-staying", "--park")  # a simulated worker parks
        assert code == 0, err                                                     # as it exits: it stops serving
        assert "w-staying: drain requested (it parks after)" in out and "left discovery" in out
        await eventually(lambda: staying.state is SimWorkerState.STOPPED, timeout_s=30)

        code, _, err = await drain_command(registry_dir, "no-such-worker")
        assert code == 2 and "no live worker 'no-such-worker'" in err


async def test_the_planners_hook_drains_the_worker_it_names_with_drain_hook(tmp_path, caplog):
    """``hook_command: [litellm-disagg, drain-hook, --park, ...]``: run by the planner's hook runner with the desired
    sizes appended, it requests the drain of ``LITELLM_DISAGG_DRAIN_WORKER`` and returns; without one it does
    nothing."""
    registry_dir = tmp_path / "registry"
    hook = DesiredHook([sys.executable, "-m", "litellm_disagg.cli", "drain-hook", "--park",
                        "--registry-dir", str(registry_dir)], timeout_s=60)
    async with SimCluster(registry=FileRegistry(registry_dir, poll_interval_s=0.05), settings=fast_settings(),
                          heartbeat_interval_s=0.2, name="sim-drain-hook") as cluster:
        named = await cluster.add(WorkerRole.DECODE, worker_id="w-named")
        other = await cluster.add(WorkerRole.DECODE, worker_id="w-other")
        caplog.set_level("INFO", logger="litellm_disagg.planner.hook")
        assert await hook.run(HookCall(DesiredPools("sim-model", 0, 2, 0))) == 0  # grows: nobody named
        assert await hook.run(HookCall(DesiredPools("sim-model", 0, 1, 0), drain="w-named")) == 0
        assert "w-named: drain requested, then park until SIGTERM" in caplog.text
        await eventually(lambda: named.state is SimWorkerState.STOPPED, timeout_s=30)
        assert other.state is SimWorkerState.READY
        assert await hook.run(HookCall(DesiredPools("sim-model", 0, 0, 0), drain="w-gone")) == 2  # refused, logged


@pytest.mark.parametrize("engine_name", ["sglang", "trtllm"])
def test_a_switchable_simulated_worker_speaks_vllm_only(engine_name):
    from litellm_disagg.sim.worker import SimWorker

    with pytest.raises(ValueError, match="vLLM"):
        SimWorker("w", WorkerRole.PREFILL, fast_settings().model_copy(update={"engine_name": engine_name}),
                  switchable=True)
