"""Settings of the proxy plugin, with every default in one place.

They are read from the ``litellm_disagg:`` section of the LiteLLM proxy config (the same ``proxy_config.yaml``;
LiteLLM ignores sections it does not know). Environment variables override single values where noted, so a
deployment can change them without editing the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ENV_REGISTRY_DIR = "LITELLM_DISAGG_REGISTRY_DIR"


def default_registry_dir() -> str:
    """The file registry directory: ``$LITELLM_DISAGG_REGISTRY_DIR``, else ``~/.cache/litellm-disagg/registry``."""
    return os.environ.get(ENV_REGISTRY_DIR) or str(Path.home() / ".cache" / "litellm-disagg" / "registry")


class FileRegistrySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["file"] = "file"
    path: str = Field(default_factory=default_registry_dir)
    ttl_s: Annotated[float, Field(gt=0)] = 10.0
    """An entry whose heartbeat is older than this is ignored."""
    poll_interval_s: Annotated[float, Field(gt=0)] = 0.25
    """How often routers look for changes (a change is seen within this)."""
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 2.0
    """How often workers refresh their entry (keep well under ``ttl_s``)."""


RegistrySettings = FileRegistrySettings


class DisaggSettings(BaseModel):
    """The ``litellm_disagg:`` section of ``proxy_config.yaml``."""

    model_config = ConfigDict(extra="forbid")

    registry: RegistrySettings = Field(default_factory=FileRegistrySettings)
    model_groups: dict[str, str] = Field(default_factory=dict)
    """Served model name -> LiteLLM model group (``model`` the client asks for). Default: the served name itself."""
    picker: Literal["least_inflight", "round_robin"] = "least_inflight"
    """How a worker is chosen among the candidates of a pool (KV-aware scoring plugs in here)."""
    prefill_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    prefill_connect_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    max_prefill_attempts: Annotated[int, Field(ge=1)] = 2
    """Prefill workers tried per request before decoding locally (aggregated)."""
    aggregated_fallback: bool = True
    """With no prefill worker (or all failing), let the decode worker compute the prompt itself instead of failing."""
    sync_interval_s: Annotated[float, Field(gt=0)] = 0.5
    """How often the plugin checks that its routing strategy is still installed on the proxy's router."""

    def model_group(self, served_model: str) -> str:
        return self.model_groups.get(served_model, served_model)

    @classmethod
    def from_proxy_config(cls, config: dict[str, Any] | None) -> DisaggSettings:
        section = (config or {}).get("litellm_disagg") or {}
        if not isinstance(section, dict):
            raise ValueError("the 'litellm_disagg' section of the proxy config must be a mapping")
        return cls.model_validate(section)
