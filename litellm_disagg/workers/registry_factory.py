"""Build the configured registry backend."""

from __future__ import annotations

from litellm_disagg.settings import RegistrySettings
from litellm_disagg.workers.file_registry import FileRegistry
from litellm_disagg.workers.registry import Registry


def make_registry(settings: RegistrySettings) -> Registry:
    if settings.backend == "file":
        return FileRegistry(settings.path, ttl_s=settings.ttl_s, poll_interval_s=settings.poll_interval_s)
    raise ValueError(f"unknown registry backend {settings.backend!r}")
