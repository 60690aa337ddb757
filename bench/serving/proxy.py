"""Start and stop the real LiteLLM proxy (``python -m litellm.proxy.proxy_cli --config ...``) for one arm: one, or
several replicas of it on the same config and key (``--proxies``)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from litellm_disagg.processes import spawn, stop, wait_until
from litellm_disagg.stack import proxy_ready
from litellm_disagg.workers.wrapper import free_port


@dataclass
class Proxy:
    base_url: str
    key: str
    proc: subprocess.Popen[bytes]
    log: Path

    def close(self) -> None:
        stop(self.proc, timeout_s=20)

    def cpu_seconds(self) -> float:
        """CPU time (user + system, all its threads) the proxy process has used so far; 0 once it has exited."""
        return process_cpu_seconds(self.proc.pid)


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, from ``/proc/<pid>/stat`` (Linux); 0.0 when it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is fields[0], utime fields[11]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(config: dict[str, Any], run_dir: Path, name: str, *, model: str, timeout_s: float = 180) -> Proxy:
    [proxy] = start_replicas(config, run_dir, name, model=model, count=1, timeout_s=timeout_s)
    return proxy


def start_replicas(config: dict[str, Any], run_dir: Path, name: str, *, model: str, count: int,
                   timeout_s: float = 180, metrics_ports: list[int] | None = None) -> list[Proxy]:
    """``count`` proxies on the same config and master key (replicas behind one address), started together.
    ``metrics_ports``: one per replica, each serving that replica's plugin metrics (``litellm_disagg.metrics.port``)."""
    if metrics_ports is not None and len(metrics_ports) != count:
        raise ValueError(f"{len(metrics_ports)} metrics ports for {count} replicas")
    paths: list[Path] = []
    for i in range(count):
        own = config
        if metrics_ports is not None:
            own = {**config, "litellm_disagg": {**config.get("litellm_disagg", {}), "metrics": {"port": metrics_ports[i]}}}
        path = run_dir / (f"proxy-{name}.yaml" if count == 1 or metrics_ports is None else f"proxy-{name}-{i}.yaml")
        path.write_text(yaml.safe_dump(own, sort_keys=False))
        paths.append(path)
    key = f"sk-bench-{secrets.token_hex(8)}"
    env = dict(os.environ, LITELLM_MASTER_KEY=key, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
    proxies: list[Proxy] = []
    try:
        for i in range(count):
            port = free_port()
            log = run_dir / (f"proxy-{name}.log" if count == 1 else f"proxy-{name}-{i}.log")
            proc = spawn([sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(paths[i]), "--host",
                          "127.0.0.1", "--port", str(port)], env=env, log=log)
            proxies.append(Proxy(f"http://127.0.0.1:{port}", key, proc, log))
        for proxy in proxies:
            wait_until(lambda p=proxy: proxy_ready(p.base_url, key, model), timeout_s=timeout_s, interval_s=0.5,
                       alive=lambda p=proxy: p.proc.poll() is None, what=f"the proxy for {name} (see {proxy.log})")
    except BaseException:
        for proxy in proxies:
            proxy.close()
        raise
    return proxies
