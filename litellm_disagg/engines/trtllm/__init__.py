"""TensorRT-LLM (``trtllm-serve``) with context/generation disaggregation: the ``TRTLLM`` engine.

Reading order: ``transfer`` (the sequential ``disaggregated_params`` protocol), ``launch`` (command line and options
file), ``metrics`` (names on ``/prometheus/metrics``). KV events: ``trtllm-serve`` publishes none to subscribers (its
``/kv_cache_events`` endpoint is polled JSON), so ``decode_kv_events`` refuses every message and workers publish no
``kv_events_endpoint``; KV-aware routing then scores them by load and by what the router itself routed.
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
    MalformedBatch,
    MetricNames,
)
from litellm_disagg.engines.trtllm.launch import detect_device, trtllm_launch
from litellm_disagg.engines.trtllm.metrics import TRTLLM_METRICS
from litellm_disagg.engines.trtllm.transfer import DisaggregatedParams, TrtllmDisaggProtocol


class TrtllmAdapter:
    """``EngineAdapter`` of ``trtllm-serve``. Stateless."""

    provider_prefix = "hosted_vllm"
    """LiteLLM's OpenAI-compatible provider that passes ``disaggregated_params`` through as a top-level field."""
    metrics: MetricNames = TRTLLM_METRICS
    kv_event_wire: KVEventWire | None = None

    def detect_device(self) -> Device:
        return detect_device()

    def launch(
        self, spec: LaunchSpec, *, python: str | None = None, base_env: Mapping[str, str] | None = None
    ) -> EngineLaunch:
        return trtllm_launch(spec, python=python, base_env=base_env)

    def decode_kv_events(self, frames: Sequence[bytes]) -> EventBatch:
        raise MalformedBatch("trtllm-serve publishes no KV event stream")


TRTLLM: Final = Engine(name="trtllm", transfer=TrtllmDisaggProtocol(), adapter=TrtllmAdapter())

__all__ = ["TRTLLM", "DisaggregatedParams", "TrtllmAdapter", "TrtllmDisaggProtocol"]
