"""Reading workers out of Consul: which services are ours, and the valid configs of one service's passing instances.

Used by ``ConsulRegistry.snapshot()`` (one pass) and by ``ConsulWatch`` (blocking queries): the callers choose the
query parameters (``index``/``wait``), this module does the reading, decoding, validation and the warn-once logging.

An instance is skipped, with one warning per distinct broken registration (not one per poll), when its health entry
is malformed, its Meta is not in a format this version reads, its config does not validate, its KV document is
missing, corrupt or not readable with the token, its ``worker_id`` differs from its service ID, or another instance
already has its ``worker_id``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, ValidationError

from litellm_disagg.discovery.consul.codec import KvReference, decode_kv, decode_meta
from litellm_disagg.discovery.consul.http import ConsulDenied, ConsulHttp
from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.runtime_config import RuntimeConfig

logger = logging.getLogger(__name__)

_KV_CACHE_SIZE = 1024
_WARNED_MAX = 10_000


class _Service(BaseModel):
    model_config = ConfigDict(extra="ignore")
    ID: str
    Service: str
    Tags: list[str] | None = None
    Meta: dict[str, str] | None = None


class _Node(BaseModel):
    model_config = ConfigDict(extra="ignore")
    Node: str = ""


class _HealthEntry(BaseModel):
    """One element of ``GET /v1/health/service/:name``: the instance, its node and checks (checks unused here)."""

    model_config = ConfigDict(extra="ignore")
    Node: _Node
    Service: _Service


@dataclass(frozen=True)
class ServiceNames:
    index: int | None
    names: frozenset[str]


@dataclass(frozen=True)
class ServiceConfigs:
    index: int | None
    configs: list[RuntimeConfig]


class ConsulReader:
    def __init__(self, http: ConsulHttp, settings: ConsulRegistrySettings):
        self.http = http
        self.settings = settings
        self._kv_cache: OrderedDict[str, RuntimeConfig] = OrderedDict()
        self._warned: set[tuple[str, ...]] = set()

    # -- which services ---------------------------------------------------------------------------------------------

    def wanted(self, name: str, tags: Iterable[str]) -> bool:
        if self.settings.tag not in tags:
            return False
        return name == self.settings.service_name or name.startswith(self.settings.service_prefix)

    async def service_names(self, params: Mapping[str, str], *, timeout_s: float | None = None) -> ServiceNames:
        response = await self.http.request("GET", "/v1/catalog/services", params=params, timeout_s=timeout_s)
        self._note_filtered(response.filtered_by_acls)
        body = response.body if isinstance(response.body, dict) else {}
        names = frozenset(
            name for name, tags in body.items()
            if isinstance(name, str) and isinstance(tags, list) and self.wanted(name, tags)
        )
        return ServiceNames(response.index, names)

    # -- one service ------------------------------------------------------------------------------------------------

    async def service_configs(
        self, name: str, params: Mapping[str, str], *, timeout_s: float | None = None
    ) -> ServiceConfigs:
        """The valid configs of the passing instances of one service (``?passing``: critical and warning left out)."""
        response = await self.http.request(
            "GET", f"/v1/health/service/{quote(name, safe='')}", params={"passing": "true", **params},
            timeout_s=timeout_s,
        )
        self._note_filtered(response.filtered_by_acls)
        entries = response.body if isinstance(response.body, list) else []
        configs = [config for raw in entries if (config := await self._config_of(name, raw)) is not None]
        return ServiceConfigs(response.index, configs)

    async def _config_of(self, service: str, raw: Any) -> RuntimeConfig | None:
        try:
            entry = _HealthEntry.model_validate(raw)
        except ValidationError as exc:
            message = f"service {service!r}: malformed health entry skipped: {_one_line(exc)}"
            self._warn_once(("entry", service, _digest(raw)), message)
            return None
        instance = entry.Service
        if self.settings.tag not in (instance.Tags or []):
            return None  # another application's instance under a shared service name: not ours, not an error
        where = f"service {service!r} instance {instance.ID!r} on node {entry.Node.Node!r}"
        meta = instance.Meta or {}
        try:
            decoded = decode_meta(meta)
            config = await self._from_kv(decoded.key) if isinstance(decoded, KvReference) else decoded
        except ValueError as exc:  # includes ValidationError and the codec's UndecodableEntry
            self._warn_once(("meta", instance.ID, _digest(meta)), f"{where}: invalid entry skipped: {_one_line(exc)}")
            return None
        if config.worker_id != instance.ID:
            self._warn_once(
                ("id", instance.ID, config.worker_id),
                f"{where}: worker_id {config.worker_id!r} does not match the service ID: skipped",
            )
            return None
        return config

    async def _from_kv(self, key: str) -> RuntimeConfig:
        cached = self._kv_cache.get(key)
        if cached is not None:
            self._kv_cache.move_to_end(key)
            return cached
        try:
            response = await self.http.request("GET", f"/v1/kv/{quote(key, safe='/')}", accept=(200, 404))
        except ConsulDenied as exc:  # this entry cannot be read by this token; the others still can
            raise ValueError(f"KV document {key!r} cannot be read: {exc.reason} (the token needs key:read)") from exc
        if response.status == 404 or not isinstance(response.body, list) or not response.body:
            raise ValueError(f"KV document {key!r} is missing")
        try:
            document = base64.b64decode(response.body[0].get("Value") or "", validate=True)
        except (binascii.Error, AttributeError, TypeError) as exc:
            raise ValueError(f"KV document {key!r} is not base64: {exc}") from exc
        config = decode_kv(key, document)  # content-addressed: safe to cache by key
        self._kv_cache[key] = config
        if len(self._kv_cache) > _KV_CACHE_SIZE:
            self._kv_cache.popitem(last=False)
        return config

    # -- all services -----------------------------------------------------------------------------------------------

    def merge(self, per_service: Mapping[str, list[RuntimeConfig]]) -> list[RuntimeConfig]:
        """One list, sorted by worker_id; a worker_id seen twice keeps its first instance (by service name)."""
        merged: dict[str, RuntimeConfig] = {}
        for service in sorted(per_service):
            for config in per_service[service]:
                if config.worker_id in merged:
                    self._warn_once(
                        ("dup", service, config.worker_id),
                        f"service {service!r}: duplicate worker_id {config.worker_id!r}: skipped",
                    )
                    continue
                merged[config.worker_id] = config
        return [merged[worker_id] for worker_id in sorted(merged)]

    # -- logging ----------------------------------------------------------------------------------------------------

    def _note_filtered(self, filtered: bool) -> None:
        if filtered:
            self._warn_once(
                ("acl",),
                "consul left results out for this ACL token (X-Consul-Results-Filtered-By-ACLs): "
                "it needs service:read and node:read on the worker services",
            )

    def _warn_once(self, key: tuple[str, ...], message: str) -> None:
        if key in self._warned:
            return
        if len(self._warned) >= _WARNED_MAX:
            self._warned.clear()
        self._warned.add(key)
        logger.warning("consul registry: %s", message)


def _digest(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
