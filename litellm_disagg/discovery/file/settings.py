"""FileRegistrySettings: the file backend's knobs and defaults (``registry:`` with ``backend: file`` or no backend).

``path`` defaults to ``$LITELLM_DISAGG_REGISTRY_DIR``, else ``~/.cache/litellm-disagg/registry``, so a worker and a
proxy started on one machine without flags find each other.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

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
