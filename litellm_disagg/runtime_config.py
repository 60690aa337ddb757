"""RuntimeConfig: what a worker publishes about itself to discovery.

It is the single boundary type between workers and routers. Workers build it from their running engine (never from
guesses); routers read it back from a registry and must treat it as untrusted input: anything that does not validate
is skipped, not half-used.

Engines. ``engine`` names the worker's engine (``litellm_disagg.engines``) and ``transfer`` says how its KV cache
moves between prefill and decode workers: one typed section per transfer protocol, told apart by ``kind``
(``TransferSection``, a discriminated union). An engine added later brings its own section type here.

Compatibility (remove in 0.3). Workers of 0.1 published the transfer endpoint as top-level ``nixl_host`` and
``nixl_port`` with ``backend: "vllm"``. Such an entry still validates (read into ``engine`` and ``transfer``), and a
serialized config still carries those three keys next to ``transfer``, so a 0.1 router reads a newer worker.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from litellm_disagg.json_fields import JsonFloat, json_enum, json_enums
from litellm_disagg.version import __version__

WorkerId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Port = Annotated[int, Field(ge=1, le=65535)]
Host = Annotated[str, Field(min_length=1, max_length=255)]
EngineName = Literal["vllm", "sglang", "trtllm"]


class WorkerRole(StrEnum):
    """What a worker does in the disaggregated pipeline."""

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"

    @property
    def can_prefill(self) -> bool:
        return self in (WorkerRole.PREFILL, WorkerRole.BOTH)

    @property
    def can_decode(self) -> bool:
        return self in (WorkerRole.DECODE, WorkerRole.BOTH)


class WorkerState(StrEnum):
    """Lifecycle of a worker as routers see it. Only READY workers get new work."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


class VllmNixlTransfer(BaseModel):
    """vLLM's NixlConnector: the decode worker pulls the prompt's KV from the prefill worker's NIXL side channel."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    kind: Literal["vllm-nixl"] = "vllm-nixl"
    host: Host
    """The NIXL side channel's address (vLLM's ``VLLM_NIXL_SIDE_CHANNEL_HOST``)."""
    port: Port
    engine_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    """vLLM's ``kv_transfer_config.engine_id``: a prefill answer must name it as ``remote_engine_id``. None (workers
    that do not publish it): the answer's engine id is not checked; its side channel still is."""

    @model_serializer(mode="wrap")
    def _omit_unset_engine_id(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Entries without an engine id are written as before (older readers, Consul's string-only Meta).
        data: dict[str, Any] = handler(self)
        if data.get("engine_id") is None:
            data.pop("engine_id", None)
        return data


class VllmNixlPushTransfer(BaseModel):
    """vLLM's NixlPushConnector: the prefill worker WRITEs the prompt's KV into blocks the decode worker holds. The
    decode request names the prefill's NIXL engine before the prefill has run (concurrent orchestration), so the
    worker publishes its engine id here (``kv_transfer_config.engine_id``, fresh per engine start)."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    kind: Literal["vllm-nixl-push"] = "vllm-nixl-push"
    host: Host
    """The NIXL side channel's address (vLLM's ``VLLM_NIXL_SIDE_CHANNEL_HOST``)."""
    port: Port
    engine_id: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
    """The engine's NIXL engine id, as the decode request's ``remote_engine_id``."""


class SglangBootstrapTransfer(BaseModel):
    """SGLang's PD disaggregation: a prefill worker's bootstrap server, where decode workers register a request's
    ``bootstrap_room`` before the prefill pushes its KV (``--disaggregation-bootstrap-port``)."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    kind: Literal["sglang-bootstrap"] = "sglang-bootstrap"
    host: Host
    """The bootstrap server's address (what the router sends as ``bootstrap_host``)."""
    port: Port
    """The bootstrap port (``bootstrap_port``)."""
    backend: Literal["nixl", "mooncake", "fake"] = "nixl"
    """``--disaggregation-transfer-backend``: prefill and decode workers must agree."""


class TrtllmDisaggTransfer(BaseModel):
    """TensorRT-LLM's disaggregated serving: the context server returns ``disaggregated_params`` (with an opaque
    state naming its cache transceiver) that the generation request carries back; nothing to dial in advance."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    kind: Literal["trtllm-disagg"] = "trtllm-disagg"
    backend: Literal["NIXL", "UCX", "MPI", "DEFAULT"] = "NIXL"
    """``cache_transceiver_config.backend``: context and generation servers must agree."""


TransferSection = Annotated[
    VllmNixlTransfer | VllmNixlPushTransfer | SglangBootstrapTransfer | TrtllmDisaggTransfer,
    Field(discriminator="kind"),
]
"""How a worker's KV cache moves, one member per transfer protocol."""

_ENGINE_TRANSFERS: Final = frozenset(
    {("vllm", "vllm-nixl"), ("vllm", "vllm-nixl-push"), ("sglang", "sglang-bootstrap"), ("trtllm", "trtllm-disagg")}
)
"""The (engine, transfer kind) pairs that exist."""


class RuntimeConfig(BaseModel):
    """One worker, as published to discovery.

    Unknown fields are ignored (a newer worker may publish more than this router knows); known fields are validated
    strictly (no type coercion from strings; only what JSON cannot say otherwise: ``json_fields.py``).
    """

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    worker_id: WorkerId
    model: Annotated[str, Field(min_length=1, max_length=256)]
    role: Annotated[WorkerRole, json_enum(WorkerRole)]
    engine: EngineName = "vllm"
    base_url: Annotated[str, Field(max_length=512)]
    """OpenAI-compatible base URL, ending in ``/v1`` (e.g. ``http://10.0.0.5:8100/v1``)."""
    transfer: TransferSection
    kv_capacity_blocks: Annotated[int, Field(ge=0)]
    block_size: Annotated[int, Field(ge=1, le=65536)]
    kv_events_endpoint: Annotated[str, Field(max_length=512)] | None = None
    tensor_parallel_size: Annotated[int, Field(ge=1, le=1024)] = 1
    api_key_required: bool = False
    """Whether the worker refuses ``/v1`` requests without its API key (vLLM's ``--api-key``). Only that it does:
    the key itself is never published; routers get it from their own configuration (``worker_auth``)."""
    allowed_roles: Annotated[tuple[WorkerRole, ...], json_enums(WorkerRole)] = ()
    """Roles the worker's launch can serve, so it can change pool without a restart (``docs/role-change.md``);
    empty: only ``role`` (a worker launched for one role, or one older than role changes)."""
    state: Annotated[WorkerState, json_enum(WorkerState)] = WorkerState.STARTING
    started_at: JsonFloat = Field(default_factory=time.time)
    version: Annotated[str, Field(max_length=64)] = __version__

    @model_validator(mode="before")
    @classmethod
    def _read_legacy_shape(cls, data: Any) -> Any:
        # A 0.1 worker's entry: top-level nixl_host/nixl_port/backend and no transfer section. Values are moved, not
        # checked: the section's own (strict) validation judges them.
        if not isinstance(data, dict) or "transfer" in data or not ("nixl_host" in data or "nixl_port" in data):
            return data
        transfer: dict[str, Any] = {"kind": "vllm-nixl"}
        for old, new in (("nixl_host", "host"), ("nixl_port", "port")):
            if old in data:
                transfer[new] = data[old]
        moved = {k: v for k, v in data.items() if k not in LEGACY_KEYS}
        if "engine" not in data and "backend" in data:
            moved["engine"] = data["backend"]
        return moved | {"transfer": transfer}

    @model_validator(mode="after")
    def _transfer_fits_engine(self) -> RuntimeConfig:
        if (self.engine, self.transfer.kind) not in _ENGINE_TRANSFERS:
            raise ValueError(f"engine {self.engine!r} has no transfer kind {self.transfer.kind!r}")
        return self

    @model_serializer(mode="wrap")
    def _write_legacy_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # For 0.1 routers, which require nixl_host/nixl_port (and know backend, not engine).
        data: dict[str, Any] = handler(self)
        if not data.get("allowed_roles", True):
            del data["allowed_roles"]  # the default: a worker that cannot change role publishes what it did before
        if "transfer" in data and isinstance(self.transfer, VllmNixlTransfer):
            data |= {"backend": self.engine, "nixl_host": self.transfer.host, "nixl_port": self.transfer.port}
        return data

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL with a host, got {value!r}")
        if parts.port is None and ":" in (parts.netloc.rsplit("@", 1)[-1]):
            raise ValueError(f"base_url has an invalid port: {value!r}")
        return value.rstrip("/")

    @property
    def server_url(self) -> str:
        """The worker's HTTP root (base_url without the trailing ``/v1``)."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    @property
    def routable(self) -> bool:
        return self.state is WorkerState.READY

    def with_state(self, state: WorkerState) -> RuntimeConfig:
        return self.model_copy(update={"state": state})

    def can_serve_role(self, role: WorkerRole) -> bool:
        """Whether the worker's launch serves ``role`` (its own, or one of ``allowed_roles``)."""
        return role is self.role or role in self.allowed_roles

    def with_role(self, role: WorkerRole) -> RuntimeConfig:
        return self.model_copy(update={"role": role})


LEGACY_KEYS: Final = frozenset({"nixl_host", "nixl_port", "backend"})
"""Top-level keys of a 0.1 entry that ``transfer`` and ``engine`` replace (read, and still written, until 0.3)."""
