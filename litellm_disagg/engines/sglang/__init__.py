"""SGLang with PD disaggregation (bootstrap rooms, NIXL transfer): the ``SGLANG`` engine.

Reading order: ``transfer`` (the concurrent bootstrap protocol and its ``BootstrapTicket``), ``launch`` (the command
line of a worker's engine), ``metrics`` (names on its ``/metrics``). KV events: SGLang's ZMQ publisher
(``python/sglang/srt/disaggregation/kv_events.py``) sends vLLM's message format (topic, 8-byte sequence, msgpack
batch of ``BlockStored``/``BlockRemoved``/``AllBlocksCleared``), so vLLM's decoder reads it.
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
from litellm_disagg.engines.sglang.launch import detect_device, sglang_launch
from litellm_disagg.engines.sglang.metrics import SGLANG_METRICS
from litellm_disagg.engines.sglang.transfer import BootstrapTicket, SglangBootstrapProtocol
from litellm_disagg.engines.vllm.kv_events import decode_message


class SglangAdapter:
    """``EngineAdapter`` of SGLang (``sglang.launch_server``). Stateless."""

    provider_prefix = "hosted_vllm"
    """LiteLLM has no SGLang provider; ``hosted_vllm`` is its OpenAI-compatible one that passes extra top-level
    fields (the bootstrap triple) through to the server as they are."""
    metrics: MetricNames = SGLANG_METRICS
    kv_event_wire: KVEventWire | None = KVEventWire.VLLM  # SGLang sends vLLM's message format

    def detect_device(self) -> Device:
        return detect_device()

    def launch(
        self, spec: LaunchSpec, *, python: str | None = None, base_env: Mapping[str, str] | None = None
    ) -> EngineLaunch:
        return sglang_launch(spec, python=python, base_env=base_env)

    def decode_kv_events(self, frames: Sequence[bytes]) -> EventBatch:
        return decode_message(frames)


SGLANG: Final = Engine(name="sglang", transfer=SglangBootstrapProtocol(), adapter=SglangAdapter())

__all__ = ["SGLANG", "BootstrapTicket", "SglangAdapter", "SglangBootstrapProtocol"]
