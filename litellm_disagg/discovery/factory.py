"""Build the configured registry backend from its settings: one table, name -> where the backend lives.

A backend is a folder under ``discovery/`` whose ``registry`` module holds a class with
``from_settings(settings) -> Registry``; adding one is that folder, one line in ``BACKENDS`` and its settings class in
the ``RegistrySettings`` union (``litellm_disagg/settings.py``). The module is imported only when its backend is
chosen, so a file-backed proxy never imports the Consul code (nor exports its ``litellm_disagg_discovery_up`` gauge).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, cast

from litellm_disagg.discovery.registry import Registry

if TYPE_CHECKING:
    from litellm_disagg.settings import RegistrySettings


class RegistryBackend(Protocol):
    """What a backend's registry class offers the factory."""

    @classmethod
    def from_settings(cls, settings: Any) -> Registry: ...


@dataclass(frozen=True)
class BackendRef:
    """A registry class named by module and attribute, imported on first use."""

    module: str
    name: str

    def load(self) -> RegistryBackend:
        return cast(RegistryBackend, getattr(importlib.import_module(self.module), self.name))


BACKENDS: Mapping[str, BackendRef] = MappingProxyType({
    "file": BackendRef("litellm_disagg.discovery.file.registry", "FileRegistry"),
    "consul": BackendRef("litellm_disagg.discovery.consul.registry", "ConsulRegistry"),
})
"""Backend name (the ``backend`` key of the ``registry:`` settings, the ``--registry`` flag) -> its registry class."""


def make_registry(settings: RegistrySettings) -> Registry:
    backend = BACKENDS.get(settings.backend)
    if backend is None:
        raise ValueError(f"unknown registry backend {settings.backend!r}; known: {', '.join(sorted(BACKENDS))}")
    return backend.load().from_settings(settings)
