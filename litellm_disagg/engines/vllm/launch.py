"""The command line and environment that start vLLM for one worker role. Pure functions: nothing is started here.

- ``vllm_argv``: the OpenAI API server with the NixlConnector in the role's KV role (``kv_producer`` for prefill,
  ``kv_consumer`` for decode, ``kv_both``), prefix caching on, KV events bound on the worker's transfer host (not
  ``*``) when asked, and on CPU ``--enforce-eager --dtype float32``; a fresh NIXL engine id per start, published.
- the worker's API key (``LaunchSpec.api_key``) goes to vLLM as ``VLLM_API_KEY`` in its environment, never argv.
- ``vllm_env``: NIXL's side channel and vLLM's host IP on the transfer host (UCX kept on loopback when that host is);
  on CPU, no CPU thread binding, ``VLLM_CPU_KVCACHE_SPACE`` dropped when the cache size is given, and
  ``sitecustomize/`` on ``PYTHONPATH`` to pace NIXL's busy-spinning progress thread and to skip vLLM's pinning of
  its NIXL worker thread to one core (``LITELLM_DISAGG_NIXL_CPU_PIN=0``).
- ``vllm_launch``: both, plus what the worker publishes (its ``VllmNixlTransfer`` section, its KV events endpoint).

``LaunchSpec.kv_transfer == "push"`` selects ``NixlPushConnector`` (the prefill WRITEs into the decode's blocks) with
a fresh NIXL engine id per start (``kv_transfer_config.engine_id``), published in a ``VllmNixlPushTransfer`` section
so a router can name this prefill engine in a decode request before the prefill has run.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import uuid
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Final

from litellm_disagg.engines.base import Device, EngineLaunch, LaunchSpec
from litellm_disagg.runtime_config import TransferSection, VllmNixlPushTransfer, VllmNixlTransfer, WorkerRole

KV_ROLES: Final[Mapping[WorkerRole, str]] = MappingProxyType({
    WorkerRole.PREFILL: "kv_producer",
    WorkerRole.DECODE: "kv_consumer",
    WorkerRole.BOTH: "kv_both",
})

SITECUSTOMIZE_DIR: Final = Path(__file__).parent / "sitecustomize"
NIXL_PROGRESS_DELAY_US: Final = 1000
"""Delay between NIXL progress-thread rounds on CPU hosts (``sitecustomize/`` applies it)."""
KV_EVENTS_TOPIC: Final = "kv"
CONNECTORS: Final[Mapping[str, str]] = MappingProxyType({"pull": "NixlConnector", "push": "NixlPushConnector"})


def detect_device() -> Device:
    """``cpu`` when vLLM's CPU build (``vllm-cpu``) is installed, else ``gpu``."""
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return "gpu"
    return "cpu"


def kv_events_endpoint(spec: LaunchSpec) -> str | None:
    """Where routers connect for the engine's KV events (the engine binds exactly this address: ``kv_events_bind``)."""
    return None if spec.kv_events_port is None else f"tcp://{spec.transfer_host}:{spec.kv_events_port}"


def kv_events_bind(spec: LaunchSpec) -> str:
    """The address vLLM's KV event publisher binds: the worker's transfer host, never every interface."""
    return f"tcp://{_zmq_host(spec.transfer_host)}:{spec.kv_events_port}"


def _zmq_host(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def new_engine_id(spec: LaunchSpec) -> str:
    """A NIXL engine id for one start of the engine (a restarted engine must not reuse its predecessor's)."""
    return f"{spec.role.value}-{spec.transfer_port}-{uuid.uuid4().hex[:12]}"


def vllm_argv(spec: LaunchSpec, python: str | None = None, *, engine_id: str | None = None) -> list[str]:
    """``engine_id``: the NIXL engine id to run under (push publishes it); None: vLLM draws one."""
    kv_transfer_config: dict[str, object] = {
        "kv_connector": CONNECTORS[spec.kv_transfer],
        "kv_role": KV_ROLES[spec.role],
        "kv_buffer_device": "cpu" if spec.device == "cpu" else "cuda",
        "kv_load_failure_policy": spec.kv_load_failure_policy,
    }
    if engine_id is not None:
        kv_transfer_config["engine_id"] = engine_id
    if spec.kv_lease_s is not None:
        kv_transfer_config["kv_connector_extra_config"] = {"kv_lease_duration": spec.kv_lease_s}
    argv = [
        python or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", spec.model,
        "--served-model-name", spec.served_model_name,
        "--host", spec.host,
        "--port", str(spec.port),
        "--kv-transfer-config", json.dumps(kv_transfer_config),
        "--enable-prefix-caching",
    ]  # fmt: skip
    if spec.max_model_len is not None:
        argv += ["--max-model-len", str(spec.max_model_len)]
    if spec.kv_cache_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(spec.kv_cache_bytes)]
    if spec.tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if spec.kv_events_port is not None:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            # The worker's own address, not "*": vLLM binds only wildcard endpoints and connects to the rest, so
            # sitecustomize/ makes it bind this one (LITELLM_DISAGG_KV_EVENTS_BIND, set by vllm_env).
            "endpoint": kv_events_bind(spec),
            "topic": KV_EVENTS_TOPIC,
        }
        argv += ["--kv-events-config", json.dumps(events)]
    if spec.device == "cpu":
        # float32: bf16 hits an AMX attention kernel that kills the decode side on some CPUs ("Illegal instruction").
        argv += ["--enforce-eager", "--dtype", "float32"]
    return argv + list(spec.extra_args)


def vllm_env(spec: LaunchSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = spec.transfer_host
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(spec.transfer_port)
    env["VLLM_HOST_IP"] = spec.transfer_host
    if _is_loopback(spec.transfer_host):
        env.setdefault("UCX_NET_DEVICES", "lo")  # else UCX also listens on the machine's other interfaces
    if spec.api_key is not None:
        env["VLLM_API_KEY"] = spec.api_key  # vLLM's --api-key, kept off the command line (ps shows argv to everyone)
    else:
        env.pop("VLLM_API_KEY", None)
    if spec.kv_events_port is not None:
        env["LITELLM_DISAGG_KV_EVENTS_BIND"] = kv_events_bind(spec)
        env["PYTHONPATH"] = _with_sitecustomize(env)
    if spec.device == "cpu":
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if spec.kv_cache_bytes is not None:
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # conflicts with --kv-cache-memory-bytes
        # NIXL's progress thread spins a whole core with its default delay of 0: on CPU the cores are the engine's
        # compute. Paced to one round per millisecond it costs about 3% of a core and keeps transfers progressing.
        env.setdefault("LITELLM_DISAGG_NIXL_PROGRESS_DELAY_US", str(NIXL_PROGRESS_DELAY_US))
        # vLLM's NIXL worker pins its main thread (forward pass and queue spinning) to the last core of each NUMA node,
        # the same core for every worker on the host: one worker's spinning then starves another's for tens of seconds
        # (sitecustomize/ explains; "0" skips the pin, "1" keeps vLLM's).
        env.setdefault("LITELLM_DISAGG_NIXL_CPU_PIN", "0")
        env["PYTHONPATH"] = _with_sitecustomize(env)
    return env


def _with_sitecustomize(env: Mapping[str, str]) -> str:
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITECUSTOMIZE_DIR)]
    return os.pathsep.join([str(SITECUSTOMIZE_DIR), *parts])


def vllm_launch(
    spec: LaunchSpec, *, python: str | None = None, base_env: Mapping[str, str] | None = None
) -> EngineLaunch:
    transfer: TransferSection
    if spec.kv_transfer == "push":
        engine_id = new_engine_id(spec)
        transfer = VllmNixlPushTransfer(host=spec.transfer_host, port=spec.transfer_port, engine_id=engine_id)
        argv = vllm_argv(spec, python, engine_id=engine_id)
    else:
        # Published so that a router can check a prefill answer names this engine (engines/vllm/transfer.py).
        engine_id = new_engine_id(spec)
        transfer = VllmNixlTransfer(host=spec.transfer_host, port=spec.transfer_port, engine_id=engine_id)
        argv = vllm_argv(spec, python, engine_id=engine_id)
    return EngineLaunch(
        argv=tuple(argv),
        env=MappingProxyType(vllm_env(spec, base_env)),
        transfer=transfer,
        kv_events_endpoint=kv_events_endpoint(spec),
    )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
