"""Real processes for end-to-end tests: vLLM workers through ``litellm-disagg worker``, and the LiteLLM proxy."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.processes import kill_tree, spawn, stop, wait_until
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole

from .net import free_port

ROOT = Path(__file__).resolve().parents[2]
MASTER_KEY = "sk-test-master-key"


def registered(registry_dir: Path, worker_id: str) -> RuntimeConfig | None:
    for config in asyncio.run(FileRegistry(registry_dir).snapshot()):
        if config.worker_id == worker_id:
            return config
    return None


def role_of(registry_dir: Path, worker_id: str) -> WorkerRole | None:
    """The worker's published role, or None while discovery leaves its entry out (a starved worker's heartbeat can go
    past the registry's TTL for a while: a CI run saw 17.5 s on two cores shared by three engines), so a wait on a
    role keeps waiting instead of failing on a missing entry."""
    config = registered(registry_dir, worker_id)
    return None if config is None else config.role


async def published_roles(registry_dir: Path, worker_ids: list[str], timeout_s: float = 120.0) -> dict[str, WorkerRole]:
    """Every listed worker's published role, once discovery lists them all (``role_of``'s reason: a starved worker's
    entry can be left out for a while); after ``timeout_s``, whatever it lists (the caller's assertion says what is
    missing)."""
    roles: dict[str, WorkerRole] = {}
    for _ in range(int(timeout_s / 0.25) + 1):
        roles = {w.worker_id: w.role for w in await FileRegistry(registry_dir).snapshot()}
        if set(worker_ids) <= roles.keys():
            break
        await asyncio.sleep(0.25)
    return roles


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class WorkerProc:
    role: str
    model_dir: Path
    registry_dir: Path
    log_dir: Path
    served_name: str = "tiny"
    kv_cache_mib: int = 64
    extra: list[str] = field(default_factory=list)
    """Arguments for vLLM (after ``--``)."""
    wrapper_args: list[str] = field(default_factory=list)
    """Arguments for the wrapper itself (e.g. ``--kv-events-port``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the worker (e.g. ``VLLM_SERVER_DEV_MODE=1`` for ``/reset_prefix_cache``)."""
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def worker_id(self) -> str:
        return f"{self.role}-{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.log_dir / f"{self.worker_id}.log"

    def start(self) -> WorkerProc:
        env = dict(os.environ, OMP_NUM_THREADS="1", **self.env)
        argv = [sys.executable, "-m", "litellm_disagg.cli", "worker", "--role", self.role, "--model", str(self.model_dir),
                "--served-model-name", self.served_name, "--port", str(self.port), "--worker-id", self.worker_id,
                "--registry-dir", str(self.registry_dir), "--kv-cache-mib", str(self.kv_cache_mib), "--max-model-len", "1024",
                "--heartbeat-interval", "1", "--drain-settle", "1.5", *self.wrapper_args, "--", "--max-num-seqs", "8", *self.extra]
        self.proc = spawn(argv, env=env, log=self.log)
        return self

    def wait_ready(self, timeout_s: float = 240) -> RuntimeConfig:
        assert self.proc is not None
        try:
            wait_until(lambda: registered(self.registry_dir, self.worker_id) is not None, timeout_s=timeout_s,
                       alive=lambda: self.proc is not None and self.proc.poll() is None, what=f"{self.worker_id} to register")
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\n--- {self.log} ---\n{log_tail(self.log)}") from exc
        config = registered(self.registry_dir, self.worker_id)
        assert config is not None
        return config

    def terminate(self, timeout_s: float = 120) -> int | None:
        """SIGTERM: the wrapper drains, withdraws and stops vLLM."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self.kill()

    def kill(self) -> None:
        """A crash: SIGKILL the wrapper and vLLM, no drain, no withdraw."""
        if self.proc is not None:
            kill_tree(self.proc.pid)
            stop(self.proc, timeout_s=5)


@dataclass
class ProxyProc:
    registry_dir: Path
    log_dir: Path
    config: Path = ROOT / "proxy_config.yaml"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the proxy (e.g. ``LITELLM_DISAGG_WORKER_API_KEY``)."""
    args: list[str] = field(default_factory=list)
    """Extra ``proxy_cli`` arguments (e.g. ``--num_workers 2``)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.log_dir / "proxy.log"

    def start(self) -> ProxyProc:
        env = dict(os.environ, LITELLM_MASTER_KEY=MASTER_KEY, LITELLM_LOCAL_MODEL_COST_MAP="True",
                   LITELLM_DISAGG_REGISTRY_DIR=str(self.registry_dir), **{"LITELLM_DISAGG_LOG_LEVEL": "INFO", **self.env})
        argv = [sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(self.config), "--host", "127.0.0.1", "--port", str(self.port), *self.args]
        self.proc = spawn(argv, env=env, log=self.log, cwd=str(ROOT))
        return self

    def models(self) -> list[str]:
        try:
            r = httpx.get(f"{self.url}/v1/models", headers={"Authorization": f"Bearer {MASTER_KEY}"}, timeout=3)
            return [m["id"] for m in r.json().get("data", [])] if r.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return []

    def wait_ready(self, model: str, timeout_s: float = 120) -> None:
        try:
            wait_until(lambda: model in self.models(), timeout_s=timeout_s,
                       alive=lambda: self.proc is not None and self.proc.poll() is None, what="the proxy to list the model")
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\n--- {self.log} ---\n{log_tail(self.log)}") from exc

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, timeout_s=15)
