"""Build the configured registry backend."""

from __future__ import annotations

from litellm_disagg.settings import ConsulRegistrySettings, FileRegistrySettings, RegistrySettings
from litellm_disagg.workers.file_registry import FileRegistry
from litellm_disagg.workers.registry import Registry


def make_registry(settings: RegistrySettings) -> Registry:
    if isinstance(settings, FileRegistrySettings):
        return FileRegistry(settings.path, ttl_s=settings.ttl_s, poll_interval_s=settings.poll_interval_s)
    if isinstance(settings, ConsulRegistrySettings):
        # Imported here: the Consul backend registers its Prometheus gauge on import, which a file-backed proxy
        # should not export.
        from litellm_disagg.workers.consul_registry import ConsulRegistry

        return ConsulRegistry(settings)
    raise ValueError(f"unknown registry backend {getattr(settings, 'backend', settings)!r}")
