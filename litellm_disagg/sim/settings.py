"""Settings of the simulated worker, with every default in one place.

``SimSettings`` reads environment variables with the prefix ``LITELLM_DISAGG_SIM_`` and ``__`` between levels, e.g.
``LITELLM_DISAGG_SIM_TIMING__SPEEDUP=50`` or ``LITELLM_DISAGG_SIM_ENGINE__NUM_GPU_BLOCKS=4096``.

Times in ``TimingSettings`` are *simulated* seconds (what the modelled GPU would take); the engine sleeps each of them
divided by ``speedup``. Times elsewhere (lease timeouts, heartbeats) are wall-clock seconds.

Default figures describe a 70B-class model (Llama-3-70B, fp16 KV: 80 layers x 8 KV heads x 128 dims x 2 (K and V)
x 2 bytes = 320 KiB per token) on H100s: prefill about 20,000 tokens/s, decode about 50 tokens/s for one sequence
rising to about 2,000 tokens/s aggregate at batch 64, KV moved over a 200 Gb/s RDMA link.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from litellm_disagg.runtime_config import EngineName

Positive = Annotated[float, Field(gt=0)]


class TimingSettings(BaseModel):
    """The cost model of one engine step and one KV transfer (see ``timing.TimingModel``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefill_tokens_per_s: Positive = 20_000.0
    """Compute-bound prefill rate, tokens per second, for prompts long enough to hide the weight read."""
    decode_tokens_per_s_batch1: Positive = 50.0
    """Decode rate of a single running sequence."""
    decode_tokens_per_s_at_ref_batch: Positive = 2_000.0
    """Aggregate decode rate when ``decode_ref_batch`` sequences run together."""
    decode_ref_batch: Annotated[int, Field(ge=2)] = 64
    kv_bytes_per_token: Annotated[int, Field(ge=1)] = 327_680
    kv_transfer_bytes_per_s: Positive = 25e9
    kv_transfer_latency_s: Annotated[float, Field(ge=0)] = 0.002
    speedup: Positive = 1.0
    """Global speed-up: every simulated duration is slept divided by this (50 makes a 1 s prefill take 20 ms)."""

    @model_validator(mode="after")
    def _decode_scales(self) -> TimingSettings:
        if self.decode_tokens_per_s_at_ref_batch <= self.decode_tokens_per_s_batch1:
            raise ValueError("decode_tokens_per_s_at_ref_batch must exceed decode_tokens_per_s_batch1 (batching helps)")
        if self.decode_tokens_per_s_at_ref_batch >= self.decode_ref_batch * self.decode_tokens_per_s_batch1:
            raise ValueError("a step of decode_ref_batch sequences cannot be faster than a step of one")
        return self


class EngineSettings(BaseModel):
    """The paged KV cache and the scheduler of one simulated engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    block_size: Annotated[int, Field(ge=1, le=4096)] = 16
    num_gpu_blocks: Annotated[int, Field(ge=1)] = 8192
    max_model_len: Annotated[int, Field(ge=2)] = 8192
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    """Most sequences in the running batch."""
    max_num_batched_tokens: Annotated[int, Field(ge=1)] = 2048
    """Token budget of one step: prefill chunks plus one token per decoding sequence (chunked prefill)."""
    enable_prefix_caching: bool = True
    default_output_tokens: Annotated[int, Field(ge=1)] = 256
    """Mean completion length when a request gives no max_tokens (the length is drawn from the prompt, 1..2x-1)."""
    kv_lease_timeout_s: Positive = 480.0
    """Wall seconds a prefill worker keeps a finished prefill's blocks for its decode (vLLM's abort timeout)."""
    bootstrap_timeout_s: Positive = 300.0
    """SGLang prefill side: wall seconds a computed prompt waits for its decode to register the bootstrap room
    (``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``)."""
    waiting_timeout_s: Positive = 300.0
    """SGLang decode side: wall seconds a registered room waits for its KV
    (``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``)."""

    @model_validator(mode="after")
    def _fits(self) -> EngineSettings:
        if self.max_model_len > self.num_gpu_blocks * self.block_size:
            raise ValueError(
                f"max_model_len {self.max_model_len} does not fit in the KV cache "
                f"({self.num_gpu_blocks} blocks x {self.block_size} tokens)"
            )
        return self


class SimSettings(BaseSettings):
    """Everything one simulated worker needs besides its role and identity."""

    model_config = SettingsConfigDict(
        env_prefix="LITELLM_DISAGG_SIM_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    model: Annotated[str, Field(min_length=1, max_length=256)] = "sim-model"
    """The served model name (what clients and the router put in ``model``)."""
    engine_name: EngineName = "vllm"
    """Which engine the worker stands in for: its transfer protocol, the transfer section it publishes and the
    metric names of its ``/metrics`` (vLLM's are always there too)."""
    kv_transfer: Literal["pull", "push"] = "pull"
    """vLLM only: which connector the worker stands in for. ``push`` (NixlPushConnector): the worker publishes a
    ``VllmNixlPushTransfer`` with its engine id, and a decode request that names that engine waits until the
    prefill of the same request id holds its blocks, then receives them (``engine._pull``)."""
    timing: TimingSettings = Field(default_factory=TimingSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    kv_events: bool = False
    """Publish vLLM KV cache events on a ZMQ PUB socket bound on 127.0.0.1 (a free port)."""
    kv_events_topic: str = "kv"
    request_log: str | None = None
    """Append one JSON line per finished request to this file: its worker, tokens and timing (``request_log.py``),
    for benchmarks that attribute time to first token. None: off."""

    def with_speedup(self, speedup: float) -> SimSettings:
        timing = TimingSettings.model_validate({**self.timing.model_dump(), "speedup": speedup})
        return self.model_copy(update={"timing": timing})
