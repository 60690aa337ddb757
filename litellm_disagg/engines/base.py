"""The engine seam: what litellm-disagg needs from an inference engine, in engine-neutral types.

An engine (vLLM, SGLang, TensorRT-LLM) is one folder under ``engines/`` that provides an ``Engine``: a
``TransferProtocol`` (how one request is split into a prefill and a decode call) and an ``EngineAdapter`` (how the
engine is started and what it reports). ``engines/__init__`` lists the engines; a worker's ``RuntimeConfig.engine``
names its engine (``engine_for``).

Transfer protocol, called by the router for each disaggregated request (all side-effect free)::

    name, concurrent, client_keys,  constants. ``concurrent`` False: the decode call starts after the prefill
    decode_serves_alone             returned (vLLM pulls the KV); True: both calls run at once (SGLang).
                                    ``client_keys`` are stripped from every client request, so no client chooses
                                    which remote KV a decode worker loads. ``decode_serves_alone`` False: a
                                    decode-only worker cannot serve aggregated (SGLang's decode mode)
    open_transfer()                 before the prefill: the handle the decode needs up front (concurrent protocols:
                                    SGLang's bootstrap host, port and a fresh room), or None (sequential); once per
                                    attempt; may draw random numbers, nothing else
    prefill_body()                  the prefill request's JSON body, from the client's prompt fields (and the opened
                                    handle, if any); once per attempt
    parse_prefill()                 the prefill's JSON response -> a typed ``TransferHandle``, checked against the
                                    answering worker's discovery entry and bounded (an answer is a claim); raises
                                    ``InvalidTransfer`` when the response is unusable; once per successful prefill call
    decode_fields()                 a handle -> the keys merged into LiteLLM's request kwargs for the decode call;
                                    once per handle (concurrent: the opened one, before the prefill answered)
    abort_decode()                  concurrent only: the engine request (path, JSON body) that ends a decode still
                                    waiting for the handle's KV, sent when its prefill failed; None: no such request

Engine adapter, used by workers (launch), the router's observers (metrics, KV events) and deployments::

    provider_prefix                 LiteLLM provider for a deployment on this engine (``hosted_vllm``)
    metrics                         ``MetricNames``: under which names the engine's ``/metrics`` reports each figure
    detect_device()                 which build of the engine is installed here (``cpu`` or ``gpu``)
    launch()                        ``LaunchSpec`` -> ``EngineLaunch``: argv, environment, and what the worker
                                    publishes about it (transfer section, KV events endpoint); starts nothing
    decode_kv_events()              one message of the engine's KV event stream -> ``EventBatch``; raises
                                    ``MalformedBatch``; on the router's hot path (tens of thousands of events a second)
    kv_event_wire                   ``KVEventWire``: the stream's wire format when the router has a compiled reader
                                    for it (vLLM's, which SGLang also sends), else None; the compiled reader gives
                                    what ``decode_kv_events`` + applying would, and leaves what it does not know to them

KV events are engine-neutral named tuples (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) in an
``EventBatch``; each engine decodes its own wire format into them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, Literal, NamedTuple, Protocol

from litellm_disagg.runtime_config import EngineName, RuntimeConfig, TransferSection, WorkerRole

Device = Literal["cpu", "gpu"]


class Endpoint(StrEnum):
    """The OpenAI endpoint a request uses; the prefill must use the same one so both halves see the same tokens."""

    CHAT = "chat/completions"
    COMPLETIONS = "completions"


# -- transfer ----------------------------------------------------------------------------------------------------------


class InvalidTransfer(ValueError):
    """A prefill response without usable transfer metadata: the decode worker could not load this prompt's KV."""


class TransferHandle:
    """What a prefill returned for its decode, typed per transfer protocol (vLLM: ``KVTransferParams``).

    Immutable. Each subclass names the protocol that made it (``protocol``), so a protocol can refuse a foreign one.
    """

    __slots__ = ()
    protocol: ClassVar[str]


class TransferProtocol(Protocol):
    """How one request is split into a prefill call and a decode call (contract: the module docstring)."""

    name: str
    """The transfer protocol's name, as in ``RuntimeConfig.transfer.kind`` (``vllm-nixl``)."""
    concurrent: bool
    """False: prefill first, decode after (vLLM pulls the KV); True: both at once (SGLang)."""
    decode_serves_alone: bool
    """Whether a decode-only worker can also compute a prompt itself (serve aggregated). False for SGLang, whose
    decode-mode servers only take requests with a bootstrap room: the router then never serves aggregated there."""
    client_keys: tuple[str, ...]
    """Request keys only the router may set; stripped from client requests (top level and ``extra_body``)."""

    def open_transfer(
        self, *, prefill: RuntimeConfig, decode: RuntimeConfig, request_id: str
    ) -> TransferHandle | None:
        """The handle known before the prefill runs (concurrent protocols), else None."""
        ...

    def prefill_body(
        self,
        endpoint: Endpoint,
        served_model: str,
        fields: Mapping[str, Any],
        *,
        prefill: RuntimeConfig,
        decode: RuntimeConfig,
        handle: TransferHandle | None = None,
    ) -> dict[str, Any]:
        """The prefill request for the client's OpenAI ``fields``, addressed to ``served_model`` on ``prefill``;
        ``handle``: what ``open_transfer`` returned."""
        ...

    def parse_prefill(
        self,
        payload: Any,
        *,
        prefill: RuntimeConfig,
        handle: TransferHandle | None = None,
        prompt_tokens: int | None = None,
    ) -> TransferHandle:
        """The prefill's decoded JSON response as a handle, checked against what discovery says about ``prefill``
        (the worker that answered) and bounded (``prompt_tokens``: the prompt's length when the router counted it).
        Raises ``InvalidTransfer`` when it is unusable or claims what the worker cannot hand out."""
        ...

    def decode_fields(self, handle: TransferHandle) -> dict[str, Any]:
        """Keys to merge into LiteLLM's ``request_kwargs`` for the decode call."""
        ...

    def abort_decode(self, handle: TransferHandle) -> tuple[str, dict[str, Any]] | None:
        """Concurrent protocols: (path on the decode worker's server, JSON body) that ends the decode waiting for
        ``handle``'s KV. None: the engine has no such request (or the protocol is sequential)."""
        ...


# -- metrics -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MetricNames:
    """Where an engine's Prometheus ``/metrics`` page reports each figure litellm-disagg reads.

    Samples of one name are summed over their label sets (an engine process may run several engine cores), except
    the KV cache usage, which is averaged. None: the engine does not report it (readers then go without).
    """

    requests_running: str
    """Gauge: requests in the engine's running batch."""
    requests_waiting: str
    """Gauge: requests queued for the running batch."""
    requests_finished: str
    """Counter: requests finished since start, for any reason (a change means recent activity)."""
    kv_cache_usage: str
    """Gauge: share of KV cache blocks in use, 0..1."""
    kv_cache_usage_fallback: str | None = None
    """An older engine release's name for ``kv_cache_usage``, read when the page lacks that one."""
    cache_config_info: str | None = None
    """Info gauge whose labels give the KV block size and capacity the engine allocated."""
    block_size_label: str = "block_size"
    capacity_blocks_label: str = "num_gpu_blocks"
    prefix_cache_queries: str | None = None
    """Counter: prompt tokens looked up in the prefix cache."""
    prefix_cache_hits: str | None = None
    """Counter: of those, tokens found."""
    prompt_tokens: str | None = None
    generation_tokens: str | None = None
    prompt_tokens_by_source: str | None = None
    """Counter of prompt tokens labelled by where they came from; ``transferred_source`` is KV that arrived by
    transfer from a prefill worker."""
    source_label: str = "source"
    transferred_source: str = "external_kv_transfer"
    transfer_time: str | None = None
    """Histogram of KV transfer durations (decode side): ``_count`` transfers, ``_sum`` their seconds."""
    transfer_bytes: str | None = None
    transfer_failures: str | None = None
    process_start: str = "process_start_time_seconds"
    """Gauge: when the engine process started (a change means a restart)."""
    path: str = "metrics"
    """Where the Prometheus page is, under the server root (TensorRT-LLM: ``prometheus/metrics``)."""
    unreported_block_size: int | None = None
    """Without ``cache_config_info``: the KV block (page) size the engine uses by default, published as the worker's
    ``block_size`` (its capacity is then published as 0: unknown)."""

    @property
    def transfer_count(self) -> str | None:
        return None if self.transfer_time is None else f"{self.transfer_time}_count"

    @property
    def transfer_seconds(self) -> str | None:
        return None if self.transfer_time is None else f"{self.transfer_time}_sum"


# -- launch ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """What a worker asks of its engine, in engine-neutral terms. Nothing engine-specific but ``extra_args``."""

    model: str
    """Model directory or name the engine loads (offline)."""
    served_model_name: str
    role: WorkerRole
    host: str
    """Address the engine's HTTP server listens on and publishes."""
    port: int
    transfer_host: str
    """Address of the KV transfer side channel (vLLM: NIXL's), published in the worker's transfer section."""
    transfer_port: int
    device: Device
    max_model_len: int | None = None
    kv_cache_bytes: int | None = None
    """KV cache size (CPU: required in practice; GPU: optional, else the engine's memory share applies)."""
    tensor_parallel_size: int = 1
    kv_events_port: int | None = None
    """Publish KV cache events on this port (None: no events)."""
    kv_load_failure_policy: Literal["recompute", "fail"] = "recompute"
    """What a decode does when loading transferred KV fails: compute the prompt itself, or fail the request."""
    kv_lease_s: int | None = None
    """How long a prefill worker keeps a finished prompt's blocks for a decode that has not read them (vLLM:
    ``kv_lease_duration``, 30 s by default); None: the engine's default."""
    kv_transfer: Literal["pull", "push"] = "pull"
    """Which way the KV moves, for engines that offer both (vLLM: NixlConnector pull, NixlPushConnector push); the
    worker publishes the matching transfer section and routers pair only workers of the same one."""
    api_key: str | None = field(default=None, repr=False)
    """The key clients (the proxy) must present on ``/v1`` (vLLM: ``VLLM_API_KEY``); None: the engine is open. Never
    on the command line, never in a repr."""
    extra_args: tuple[str, ...] = ()
    """Appended to the engine's command line as given."""


@dataclass(frozen=True)
class EngineLaunch:
    """How to start one engine process, and what its worker publishes about it once it is up."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    """The whole environment of the engine process."""
    transfer: TransferSection
    kv_events_endpoint: str | None
    """Where routers subscribe to the engine's KV events (``RuntimeConfig.kv_events_endpoint``)."""
    files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Files the engine reads (absolute path -> text), written by the worker before it starts the engine
    (TensorRT-LLM's ``--extra_llm_api_options`` YAML)."""


# -- KV events ---------------------------------------------------------------------------------------------------------


class KVEventWire(StrEnum):
    """A KV event wire format the router can read without ``decode_kv_events`` (``routing/kv/_kvwire.pyx``)."""

    VLLM = "vllm"
    """vLLM's ``ZmqEventPublisher``: topic, 8-byte sequence, msgpack batch of map-encoded events."""


EngineHash = int | bytes
"""A block hash as the engine publishes it: salted per engine process, meaningful only to that engine."""


class MalformedBatch(ValueError):
    """A message that is not a KV event batch. ``seq``: its sequence number when that much was readable."""

    def __init__(self, message: str, *, seq: int | None = None):
        super().__init__(message)
        self.seq = seq


class BlockStored(NamedTuple):
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    """The engine's hash of the block before these (None at the start of a sequence)."""
    token_ids: list[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    """The LoRA adapter's name (or its id as text); None for the base model."""
    group_idx: int | None = None
    extra_keys: list[Any] | None = None
    """Per block: None, or what else the engine hashed (multimodal inputs, cache salt, adapter)."""


class BlockRemoved(NamedTuple):
    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(NamedTuple):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
"""Events are named tuples (cheap to build: a busy engine sends tens of thousands a second)."""


@dataclass(frozen=True, slots=True)
class EventBatch:
    seq: int
    """+1 per batch from one engine process; a gap means lost batches."""
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


# -- the adapter and the engine ----------------------------------------------------------------------------------------


class EngineAdapter(Protocol):
    """How an engine is started and what it reports (contract: the module docstring)."""

    provider_prefix: str
    """LiteLLM provider prefix of a deployment on this engine: ``f"{provider_prefix}/{served_model}"``."""
    metrics: MetricNames
    kv_event_wire: KVEventWire | None
    """The KV event stream's wire format, when the router has a compiled reader for it; None: ``decode_kv_events``."""

    def detect_device(self) -> Device:
        """Which build of the engine is installed in this environment."""
        ...

    def launch(
        self, spec: LaunchSpec, *, python: str | None = None, base_env: Mapping[str, str] | None = None
    ) -> EngineLaunch:
        """The engine process for ``spec``. ``python``: the interpreter (default: this one); ``base_env``: the
        environment to start from (default: this process's)."""
        ...

    def decode_kv_events(self, frames: Sequence[bytes]) -> EventBatch:
        """One message of the engine's KV event stream. Raises ``MalformedBatch``."""
        ...


@dataclass(frozen=True)
class Engine:
    """One engine: its name (as in ``RuntimeConfig.engine``), transfer protocol and adapter."""

    name: EngineName
    transfer: TransferProtocol
    """The engine's default transfer protocol."""
    adapter: EngineAdapter
    other_transfers: tuple[TransferProtocol, ...] = ()
    """Further protocols the engine speaks (vLLM: the push connector's); a worker's ``transfer.kind`` picks one."""

    def transfer_for(self, kind: str) -> TransferProtocol:
        """The protocol called ``kind`` (``RuntimeConfig.transfer.kind``). Raises ``LookupError``."""
        for protocol in (self.transfer, *self.other_transfers):
            if protocol.name == kind:
                return protocol
        raise LookupError(f"engine {self.name} has no transfer protocol {kind!r}")
