"""The command line and environment that start SGLang for one worker role. Pure functions: nothing is started here.

``python -m sglang.launch_server`` (``python/sglang/srt/server_args.py``) with ``--disaggregation-mode prefill`` or
``decode`` (a ``both`` worker runs aggregated: mode ``null``), ``--disaggregation-transfer-backend nixl``, and on the
prefill side ``--disaggregation-bootstrap-port`` (the bootstrap server decode workers dial; published as the worker's
``SglangBootstrapTransfer``). Metrics on (``--enable-metrics``); KV events, when asked, through
``--kv-events-config`` (a ZMQ publisher on ``tcp://*:PORT``, vLLM's wire format: ``engines/sglang/__init__``).
SGLang needs a CUDA device: ``detect_device`` says ``gpu`` always.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from litellm_disagg.engines.base import Device, EngineLaunch, LaunchSpec
from litellm_disagg.runtime_config import SglangBootstrapTransfer, WorkerRole

DISAGGREGATION_MODES: Final[Mapping[WorkerRole, str]] = MappingProxyType({
    WorkerRole.PREFILL: "prefill",
    WorkerRole.DECODE: "decode",
    WorkerRole.BOTH: "null",
})
TRANSFER_BACKEND: Final = "nixl"
KV_EVENTS_TOPIC: Final = "kv"


def detect_device() -> Device:
    return "gpu"


def kv_events_endpoint(spec: LaunchSpec) -> str | None:
    return None if spec.kv_events_port is None else f"tcp://{spec.transfer_host}:{spec.kv_events_port}"


def sglang_argv(spec: LaunchSpec, python: str | None = None) -> list[str]:
    argv = [
        python or sys.executable, "-m", "sglang.launch_server",
        "--model-path", spec.model,
        "--served-model-name", spec.served_model_name,
        "--host", spec.host,
        "--port", str(spec.port),
        "--disaggregation-mode", DISAGGREGATION_MODES[spec.role],
        "--enable-metrics",
    ]  # fmt: skip
    if spec.role is not WorkerRole.BOTH:
        argv += ["--disaggregation-transfer-backend", TRANSFER_BACKEND]
    if spec.role is WorkerRole.PREFILL:
        argv += ["--disaggregation-bootstrap-port", str(spec.transfer_port)]
    if spec.max_model_len is not None:
        argv += ["--context-length", str(spec.max_model_len)]
    if spec.tensor_parallel_size != 1:
        argv += ["--tp-size", str(spec.tensor_parallel_size)]
    if spec.kv_events_port is not None:
        events = {"publisher": "zmq", "endpoint": f"tcp://*:{spec.kv_events_port}", "topic": KV_EVENTS_TOPIC}
        argv += ["--kv-events-config", json.dumps(events)]
    return argv + list(spec.extra_args)


def sglang_env(spec: LaunchSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("SGLANG_HOST_IP", spec.transfer_host)  # the address the bootstrap server and NIXL advertise
    return env


def sglang_launch(
    spec: LaunchSpec, *, python: str | None = None, base_env: Mapping[str, str] | None = None
) -> EngineLaunch:
    return EngineLaunch(
        argv=tuple(sglang_argv(spec, python)),
        env=MappingProxyType(sglang_env(spec, base_env)),
        transfer=SglangBootstrapTransfer(host=spec.transfer_host, port=spec.transfer_port),
        kv_events_endpoint=kv_events_endpoint(spec),
    )
