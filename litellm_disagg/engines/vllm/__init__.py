"""vLLM with its NixlConnector: the ``VLLM`` engine.

Reading order: ``transfer`` (the prefill/decode protocol and its typed handle; ``push`` the push connector's,
concurrent), ``launch`` (the command line and
environment of a worker's engine), ``metrics`` (names on its ``/metrics``), ``kv_events`` (its KV event wire format).
``sitecustomize/`` goes on the engine's ``PYTHONPATH`` on CPU hosts (turns NIXL's busy-spinning progress thread off).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from litellm_disagg.engines.base import (
    Device,
    Engine,
    EngineLaunch,
    EventBatch,
    KVEventWire,
    LaunchSpec,
    MetricNames,
)
from litellm_disagg.engines.vllm.kv_events import decode_message
from litellm_disagg.engines.vllm.launch import detect_device, vllm_launch
from litellm_disagg.engines.vllm.metrics import VLLM_METRICS
from litellm_disagg.engines.vllm.push import PushTicket, VllmNixlPushProtocol
from litellm_disagg.engines.vllm.transfer import KVTransferParams, VllmNixlProtocol


class VllmAdapter:
    """``EngineAdapter`` of vLLM (OpenAI API server, NixlConnector). Stateless."""

    provider_prefix = "hosted_vllm"
    metrics: MetricNames = VLLM_METRICS
    kv_event_wire: KVEventWire | None = KVEventWire.VLLM

    def detect_device(self) -> Device:
        return detect_device()

    def launch(
        self, spec: LaunchSpec, *, python: str | None = None, base_env: Mapping[str, str] | None = None
    ) -> EngineLaunch:
        return vllm_launch(spec, python=python, base_env=base_env)

    def decode_kv_events(self, frames: Sequence[bytes]) -> EventBatch:
        return decode_message(frames)


VLLM: Final = Engine(
    name="vllm", transfer=VllmNixlProtocol(), adapter=VllmAdapter(), other_transfers=(VllmNixlPushProtocol(),)
)

__all__ = ["VLLM", "KVTransferParams", "PushTicket", "VllmAdapter", "VllmNixlProtocol", "VllmNixlPushProtocol"]
