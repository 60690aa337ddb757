"""The settings of request migration (``routing/migration.py``): ``migration:`` in the ``litellm_disagg:`` section."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class MigrationSettings(BaseModel):
    """``migration:`` in the ``litellm_disagg:`` section."""

    model_config = ConfigDict(extra="forbid")

    max_migrations: Annotated[int, Field(ge=0)] = 3
    """Continuations per request at most (0: migration off; a broken stream fails as LiteLLM reports it)."""
    connect_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    read_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """Longest wait for the next chunk of a continuation (its prompt is computed locally first)."""

    @property
    def enabled(self) -> bool:
        return self.max_migrations > 0
