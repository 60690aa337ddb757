"""The Grafana dashboard against a real Prometheus scraping a real proxy in front of simulated workers.

A real LiteLLM proxy (``python -m litellm.proxy.proxy_cli``) runs the shipped ``proxy_config.yaml`` (its ``prometheus``
callback mounts ``/metrics``) over one prefill and one decode simulated worker, with KV-aware routing on. A real
Prometheus (Debian's package, installed by ``scripts/setup.sh``) scrapes it every second with the shipped scrape job
(``deploy/prometheus/prometheus.yml``: bearer key), while streamed and plain requests go through. Then every target of
every panel of ``deploy/grafana/*.json`` is evaluated through Prometheus' HTTP API: each returns data, and every
metric a panel names exists in Prometheus. Planner panels read placeholders until the planner lands (desired pool
sizes are NaN, decision counters 0). Every process is stopped by its PID.

Without ``prometheus`` on the PATH the test is skipped on a developer machine and fails under CI (``CI`` set).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.processes import spawn, stop
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster
from litellm_disagg.workers.wrapper import free_port

from .sim.conftest import fast_settings

ROOT = Path(__file__).resolve().parents[1]
MODEL = "sim-model"
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$model": ".*"}
METRIC_NAME = re.compile(r"\b(litellm_disagg_[a-z0-9_]+)\b")


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        message = "prometheus is not installed: run scripts/setup.sh as root (it installs Debian's package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, PromQL with Grafana's variables filled in) for every target of every panel."""
    out = []
    for path in sorted((ROOT / "deploy" / "grafana").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for variable, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(variable, value)
                assert "$" not in expr, f"{path.name}: {panel['title']}: unknown variable in {expr}"
                out.append((path.name, panel["title"], expr))
    return out


def test_every_dashboard_panel_has_a_query():
    targets = dashboard_targets()
    assert targets
    titled = {(f, t) for f, t, _ in targets}
    for path in (ROOT / "deploy" / "grafana").glob("*.json"):
        for panel in json.loads(path.read_text())["panels"]:
            if panel["type"] != "row":
                assert (path.name, panel["title"]) in titled


def proxy_config(registry_dir: Path) -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
    assert "prometheus" in config["litellm_settings"]["callbacks"]
    config["router_settings"]["num_retries"] = 0
    config["litellm_disagg"]["registry"] = {"backend": "file", "path": str(registry_dir), "poll_interval_s": 0.1}
    config["litellm_disagg"]["sync_interval_s"] = 0.25
    # Always remote (the cost model would prefill these short prompts locally): transfers to show.
    config["litellm_disagg"]["kv_routing"] = {"enabled": True, "disaggregation": {"mode": "always"}}
    return config


def prometheus_config(proxy_port: int, key_file: Path) -> dict[str, Any]:
    shipped = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    [job] = [j for j in shipped["scrape_configs"] if j["job_name"] == "litellm-proxy"]
    job["authorization"]["credentials_file"] = str(key_file)
    job["static_configs"] = [{"targets": [f"127.0.0.1:{proxy_port}"]}]
    job["scrape_interval"] = "1s"
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": [job]}


async def until(check, *, timeout_s: float, what: str, alive=lambda: True) -> None:
    """Poll ``check`` (async) without blocking the loop the simulated workers run on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if not alive():
            raise RuntimeError(f"a process died waiting for {what}")
        if await check():
            return
        await asyncio.sleep(0.25)
    raise TimeoutError(f"timed out waiting for {what}")


async def query(client: httpx.AsyncClient, base: str, expr: str) -> list[dict[str, Any]]:
    response = await client.get(f"{base}/api/v1/query", params={"query": expr})
    body = response.json()
    assert body.get("status") == "success", f"{expr}: {body}"
    return body["data"]["result"]


async def test_every_panel_returns_data_from_a_real_prometheus(tmp_path, prometheus_binary):
    registry_dir = tmp_path / "registry"
    key = f"sk-dash-{secrets.token_hex(8)}"
    key_file = tmp_path / "key"
    key_file.write_text(key)
    config_path = tmp_path / "proxy_config.yaml"
    config_path.write_text(yaml.safe_dump(proxy_config(registry_dir), sort_keys=False))
    proxy_port, prom_port = free_port(), free_port()
    proxy_base, prom_base = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{prom_port}"
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(yaml.safe_dump(prometheus_config(proxy_port, key_file)))
    procs: list[subprocess.Popen[bytes]] = []
    env = dict(os.environ, LITELLM_MASTER_KEY=key, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    headers = {"Authorization": f"Bearer {key}"}

    def alive() -> bool:
        return all(p.poll() is None for p in procs)

    async with SimCluster(
        registry=FileRegistry(registry_dir), settings=fast_settings(kv_events=True), heartbeat_interval_s=0.2
    ) as cluster, httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:
        await cluster.start(prefill=1, decode=1)
        try:
            procs.append(spawn([sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(config_path),
                                "--host", "127.0.0.1", "--port", str(proxy_port)], env=env, log=tmp_path / "proxy.log"))

            async def proxy_ready() -> bool:
                try:
                    r = await client.get(f"{proxy_base}/v1/models", headers=headers)
                except httpx.HTTPError:
                    return False
                return r.status_code == 200 and any(m.get("id") == MODEL for m in r.json().get("data", []))

            await until(proxy_ready, timeout_s=180, what="the proxy (see proxy.log)", alive=alive)
            procs.append(spawn([prometheus_binary, f"--config.file={prom_config}",
                                f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                               log=tmp_path / "prometheus.log"))

            async def scraped() -> bool:
                try:
                    return bool(await query(client, prom_base, 'litellm_disagg_build_info{job="litellm-proxy"}'))
                except (httpx.HTTPError, ValueError, AssertionError):
                    return False

            await until(scraped, timeout_s=120, what="Prometheus' first scrape of the proxy", alive=alive)
            assert (await client.get(f"{proxy_base}/metrics")).status_code == 401  # the key is needed

            sent = 0
            for round_ in range(4):
                bodies = [
                    {"model": MODEL, "max_tokens": 8, "stream": i % 2 == 0,
                     "messages": [{"role": "user", "content": f"Observe round {round_} request {i}. " * 4}]}
                    for i in range(6)
                ]
                replies = await asyncio.gather(*(
                    client.post(f"{proxy_base}/v1/chat/completions", json=b, headers=headers) for b in bodies
                ))
                assert [r.status_code for r in replies] == [200] * len(bodies), replies[0].text
                sent += len(bodies)
                await asyncio.sleep(1.2)  # spread the load over several scrapes

            # What up prints (the shipped config): the requests just sent, counted and timed.
            page = await client.get(f"{proxy_base}/metrics/", headers=headers)
            assert page.status_code == 200 and "litellm_disagg_time_to_first_token_seconds_bucket" in page.text
            counted = sum(
                float(line.rsplit(" ", 1)[1]) for line in page.text.splitlines()
                if line.startswith("litellm_disagg_requests_total{")
            )
            assert counted == sent

            targets = dashboard_targets()
            missing: list[str] = []

            async def every_panel_has_data() -> bool:
                missing.clear()
                if not await query(client, prom_base, f"sum(litellm_disagg_requests_total) >= {sent}"):
                    missing.append("not every request counted yet")
                for name, title, expr in targets:
                    if not await query(client, prom_base, expr):
                        missing.append(f"{name}: {title}: {expr}")
                return not missing

            try:
                await until(every_panel_has_data, timeout_s=90, what="data for every panel", alive=alive)
            except TimeoutError:
                pytest.fail("panels without data:\n" + "\n".join(missing))

            names = set((await client.get(f"{prom_base}/api/v1/label/__name__/values")).json()["data"])
            unknown = sorted({n for _, _, expr in targets for n in METRIC_NAME.findall(expr)} - names)
            assert not unknown, f"panels name metrics Prometheus does not have: {unknown}"
            decode = cluster.workers_with(WorkerRole.DECODE)[0]
            assert decode.engine.stats.prompt_tokens_external_kv_transfer > 0  # really disaggregated
        finally:
            for proc in reversed(procs):
                stop(proc, timeout_s=20)
