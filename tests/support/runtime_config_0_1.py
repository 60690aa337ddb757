"""RuntimeConfig as litellm-disagg 0.1 shipped it (verbatim but for this docstring): what a 0.1 router validates.

Kept to test that entries written by newer workers still validate in a 0.1 router (tests/test_runtime_config.py).
Delete together with the compatibility code in ``litellm_disagg/runtime_config.py``.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from litellm_disagg.version import __version__

WorkerId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Port = Annotated[int, Field(ge=1, le=65535)]


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


class RuntimeConfig(BaseModel):
    """One worker, as published to discovery.

    Unknown fields are ignored (a newer worker may publish more than this router knows); known fields are validated
    strictly (no type coercion from strings).
    """

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    worker_id: WorkerId
    model: Annotated[str, Field(min_length=1, max_length=256)]
    role: WorkerRole
    backend: Literal["vllm"] = "vllm"
    base_url: Annotated[str, Field(max_length=512)]
    """OpenAI-compatible base URL, ending in ``/v1`` (e.g. ``http://10.0.0.5:8100/v1``)."""
    nixl_host: Annotated[str, Field(min_length=1, max_length=255)]
    nixl_port: Port
    kv_capacity_blocks: Annotated[int, Field(ge=0)]
    block_size: Annotated[int, Field(ge=1, le=65536)]
    kv_events_endpoint: Annotated[str, Field(max_length=512)] | None = None
    tensor_parallel_size: Annotated[int, Field(ge=1, le=1024)] = 1
    state: WorkerState = WorkerState.STARTING
    started_at: float = Field(default_factory=time.time)
    version: Annotated[str, Field(max_length=64)] = __version__

    # Strict mode would refuse the enum values as plain strings coming from JSON; accept exactly those strings.
    @field_validator("role", mode="before")
    @classmethod
    def _role_from_str(cls, value: object) -> object:
        return WorkerRole(value) if isinstance(value, str) else value

    @field_validator("state", mode="before")
    @classmethod
    def _state_from_str(cls, value: object) -> object:
        return WorkerState(value) if isinstance(value, str) else value

    @field_validator("started_at", mode="before")
    @classmethod
    def _started_at_number(cls, value: object) -> object:
        # JSON has one number type: accept an integral value for a float field, nothing else.
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value

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
