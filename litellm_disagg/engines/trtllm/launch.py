"""The command line, environment and options file that start ``trtllm-serve`` for one worker role. Pure functions:
nothing is started or written here (the worker writes ``EngineLaunch.files`` before it starts the engine).

``trtllm-serve MODEL --backend pytorch`` (``tensorrt_llm/commands/serve.py``) with ``--extra_llm_api_options`` naming
a YAML file of LLM API options: ``cache_transceiver_config.backend`` (NIXL: the KV moves between context and
generation servers; both must agree), the perf metrics its ``/prometheus/metrics`` page needs
(``return_perf_metrics``, ``enable_iter_perf_stats``), and for a context server ``disable_overlap_scheduler`` (as
TensorRT-LLM's disaggregated examples configure context servers). The role is not a flag: a server serves
``context_only`` and ``generation_only`` requests alike, so the router's choice of roles decides. KV events are not
published over the network by ``trtllm-serve`` (its ``/kv_cache_events`` endpoint is polled JSON): none here.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from litellm_disagg.engines.base import Device, EngineLaunch, LaunchSpec
from litellm_disagg.runtime_config import TrtllmDisaggTransfer, WorkerRole

TRANSCEIVER_BACKEND: Final = "NIXL"


def detect_device() -> Device:
    return "gpu"


def options_path(spec: LaunchSpec) -> str:
    return str(Path(tempfile.gettempdir()) / f"litellm-disagg-trtllm-{spec.role.value}-{spec.port}.yaml")


def llm_api_options(spec: LaunchSpec) -> dict[str, Any]:
    options: dict[str, Any] = {
        "cache_transceiver_config": {"backend": TRANSCEIVER_BACKEND},
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
        "kv_cache_config": {"enable_block_reuse": True},
    }
    if spec.role is WorkerRole.PREFILL:
        options["disable_overlap_scheduler"] = True
    if spec.kv_cache_bytes is not None:
        options["kv_cache_config"]["max_gpu_total_bytes"] = spec.kv_cache_bytes
    return options


def trtllm_argv(spec: LaunchSpec) -> list[str]:
    argv = [
        "trtllm-serve", spec.model,
        "--host", spec.host,
        "--port", str(spec.port),
        "--backend", "pytorch",
        "--extra_llm_api_options", options_path(spec),
    ]  # fmt: skip
    if spec.max_model_len is not None:
        argv += ["--max_seq_len", str(spec.max_model_len)]
    if spec.tensor_parallel_size != 1:
        argv += ["--tp_size", str(spec.tensor_parallel_size)]
    return argv + list(spec.extra_args)


def trtllm_launch(
    spec: LaunchSpec, *, python: str | None = None, base_env: Mapping[str, str] | None = None
) -> EngineLaunch:
    # JSON is YAML: the options file needs no YAML writer.
    return EngineLaunch(
        argv=tuple(trtllm_argv(spec)),
        env=MappingProxyType(dict(os.environ if base_env is None else base_env)),
        transfer=TrtllmDisaggTransfer(backend=TRANSCEIVER_BACKEND),
        kv_events_endpoint=None,
        files=MappingProxyType({options_path(spec): json.dumps(llm_api_options(spec), indent=2) + "\n"}),
    )
