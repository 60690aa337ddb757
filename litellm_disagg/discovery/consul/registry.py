"""The Consul registry: workers are Consul services, routers follow them with blocking queries.

This module puts the package's parts together (the package docstring gives the reading order):

Worker side
    ``publish(config)``
        ``PUT /v1/agent/service/register?replace-existing-checks=true``: ID = worker_id, Name = the configured
        ``service_name`` or ``<service_prefix><model>``, Tags = [tag, role, state], Address/Port from ``base_url``,
        Meta = the config (or a pointer to its KV document, written first), and one check: a TTL check (default) or
        an HTTP check on the worker's ``/health``, with ``DeregisterCriticalServiceAfter``. Starts ``passing``.
    ``heartbeat(worker_id)``
        ``PUT /v1/agent/check/pass/service:<worker_id>`` (TTL), or a look-up of the service (HTTP check). When the
        agent has lost the registration (restarted without state, or reaped it after an outage), registers again.
    ``withdraw(worker_id)``
        ``PUT /v1/agent/service/deregister/<worker_id>`` (unknown is fine), the worker's KV documents and its role
        request.
    ``role_requests(worker_id)``
        Blocking queries on ``<role_kv_prefix>/<worker_id>`` (``roles.py``).

Planner and operator side
    ``request_role(worker_id, role)``, ``request_drain(worker_id)``
        Checks the live entries (``discovery/roles.py``), then ``PUT /v1/kv/<role_kv_prefix>/<worker_id>``.

Router side
    ``snapshot()``
        ``GET /v1/catalog/services`` -> services with our tag and name, then ``GET /v1/health/service/<name>?passing``
        for each. Raises ``RegistryError`` when Consul cannot be read.
    ``watch()``
        The same, as blocking queries (``watch``); never ends before ``close()``, survives outages.
    ``discovery_up`` / gauge ``litellm_disagg_discovery_up``
        Whether the last discovery read reached Consul.

Why our own httpx client and not py-consul: see the package docstring.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from litellm_disagg.discovery.consul import roles
from litellm_disagg.discovery.consul.codec import (
    ConfigTooLarge,
    KvDocument,
    address_and_port,
    encode,
    go_duration,
    service_name_for,
    service_tags,
    worker_id_prefix,
)
from litellm_disagg.discovery.consul.endpoint import ConsulEndpoint
from litellm_disagg.discovery.consul.http import ConsulError, ConsulHttp, ConsulHTTPError
from litellm_disagg.discovery.consul.reader import ConsulReader
from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.discovery.consul.watch import ConsulWatch
from litellm_disagg.discovery.registry import RegistryError
from litellm_disagg.discovery.roles import AfterDrain, RoleRequest, check_request, drain_request
from litellm_disagg.discovery.status import DiscoveryStatus
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole

logger = logging.getLogger(__name__)

_KEEP_KV_DOCUMENTS = 2  # the current document and the one before it (a reader may still hold the old registration)


@dataclass
class _Published:
    config: RuntimeConfig
    kv_keys: list[str] = field(default_factory=list)
    """KV documents this process wrote for the worker, oldest first."""


class ConsulRegistry:
    """A ``Registry`` on Consul's HTTP API (agent, catalog, health and KV endpoints)."""

    def __init__(self, settings: ConsulRegistrySettings | None = None, *, environ: Mapping[str, str] | None = None):
        self.settings = settings if settings is not None else ConsulRegistrySettings()
        self.endpoint = ConsulEndpoint.resolve(self.settings, environ)
        self._http = ConsulHttp(self.endpoint, timeout_s=self.settings.request_timeout_s)
        self._reader = ConsulReader(self._http, self.settings)
        self._status = DiscoveryStatus("consul")
        self._published: dict[str, _Published] = {}
        self._watches: set[ConsulWatch] = set()
        self._closed = False

    @classmethod
    def from_settings(cls, settings: ConsulRegistrySettings) -> ConsulRegistry:
        return cls(settings)

    def __repr__(self) -> str:
        return f"ConsulRegistry({self.endpoint!r})"

    @property
    def discovery_up(self) -> bool:
        """True when the last discovery read (snapshot or watch) reached Consul."""
        return self._status.up is True

    # -- worker side ------------------------------------------------------------------------------------------------

    async def publish(self, config: RuntimeConfig) -> None:
        self._check_open()
        try:
            encoded = encode(config, kv_prefix=self.settings.kv_prefix)
        except ConfigTooLarge as exc:
            raise RegistryError(str(exc)) from exc
        previous = self._published.get(config.worker_id)
        kv_keys = list(previous.kv_keys) if previous is not None else []
        if encoded.kv is not None:
            if previous is None:  # documents left by an earlier process with this worker_id
                await self._delete_kv(worker_id_prefix(self.settings.kv_prefix, config.worker_id), recurse=True)
            await self._put_kv(encoded.kv)
            kv_keys = [key for key in kv_keys if key != encoded.kv.key] + [encoded.kv.key]
        await self._http.request(
            "PUT",
            "/v1/agent/service/register",
            params={"replace-existing-checks": "true"},
            json_body=self._registration(config, encoded.meta),
            datacenter=False,
        )
        stale, kept = kv_keys[:-_KEEP_KV_DOCUMENTS], kv_keys[-_KEEP_KV_DOCUMENTS:]
        self._published[config.worker_id] = _Published(config, kept)
        for key in stale:
            try:
                await self._delete_kv(key)
            except ConsulError as exc:
                logger.warning("could not delete the old KV document %s: %s", key, exc)

    async def heartbeat(self, worker_id: str) -> None:
        self._check_open()
        published = self._published.get(worker_id)
        if published is None:
            raise RegistryError(f"heartbeat for {worker_id!r}, which this registry did not publish")
        if self.settings.check == "ttl":
            try:
                await self._http.request(
                    "PUT", f"/v1/agent/check/pass/{quote(_check_id(worker_id), safe=':')}", datacenter=False
                )
                return
            except ConsulHTTPError as exc:
                if not _unknown_check(exc):
                    raise
        else:
            response = await self._http.request(
                "GET", f"/v1/agent/service/{quote(worker_id, safe='')}", accept=(200, 404), datacenter=False
            )
            if response.status == 200:
                return
        logger.warning("consul agent lost the registration of %s; registering it again", worker_id)
        await self.publish(published.config)

    async def withdraw(self, worker_id: str) -> None:
        self._check_open()
        await self._http.request(
            "PUT", f"/v1/agent/service/deregister/{quote(worker_id, safe='')}", accept=(200, 404), datacenter=False
        )
        published = self._published.pop(worker_id, None)
        if published is not None and published.kv_keys:
            await self._delete_kv(worker_id_prefix(self.settings.kv_prefix, worker_id), recurse=True)
        if published is not None:
            await roles.delete(self._http, self.settings, worker_id)

    # -- role requests (discovery/roles.py) -------------------------------------------------------------------------

    async def request_role(self, worker_id: str, role: WorkerRole) -> None:
        check_request(await self.snapshot(), worker_id, role)
        await roles.write(self._http, self.settings, RoleRequest(worker_id=worker_id, role=role))

    async def request_drain(self, worker_id: str, *, then: AfterDrain = AfterDrain.EXIT) -> None:
        await roles.write(self._http, self.settings, drain_request(await self.snapshot(), worker_id, then))

    async def role_requests(self, worker_id: str) -> AsyncIterator[RoleRequest | None]:
        if self._closed:
            return
        async for request in roles.follow(self._http, self.settings, worker_id, lambda: self._closed):
            yield request

    def _registration(self, config: RuntimeConfig, meta: dict[str, str]) -> dict[str, Any]:
        address, port = address_and_port(config.base_url)
        s = self.settings
        check: dict[str, Any] = {
            "CheckID": _check_id(config.worker_id),
            "Status": "passing",
            "DeregisterCriticalServiceAfter": go_duration(s.deregister_critical_after_s),
        }
        if s.check == "ttl":
            check |= {"Name": "litellm-disagg heartbeat", "TTL": go_duration(s.check_ttl_s)}
        else:
            check |= {
                "Name": "litellm-disagg /health",
                "HTTP": f"{config.server_url}/health",
                "Method": "GET",
                "Interval": go_duration(s.check_interval_s),
                "Timeout": go_duration(s.check_timeout_s),
            }
        return {
            "ID": config.worker_id,
            "Name": s.service_name or service_name_for(config.model, s.service_prefix),
            "Tags": service_tags(config, s.tag),
            "Address": address,
            "Port": port,
            "Meta": meta,
            "Check": check,
        }

    async def _put_kv(self, document: KvDocument) -> None:
        response = await self._http.request("PUT", f"/v1/kv/{quote(document.key, safe='/')}", content=document.value)
        if response.body is not True:
            raise RegistryError(f"consul refused to write KV {document.key!r}: {response.body!r}")

    async def _delete_kv(self, key: str, *, recurse: bool = False) -> None:
        params = {"recurse": "true"} if recurse else {}
        await self._http.request("DELETE", f"/v1/kv/{quote(key, safe='/')}", params=params)

    # -- router side ------------------------------------------------------------------------------------------------

    async def snapshot(self) -> list[RuntimeConfig]:
        self._check_open()
        try:
            names = await self._reader.service_names({})
            per_service = {name: (await self._reader.service_configs(name, {})).configs for name in sorted(names.names)}
        except ConsulError as exc:
            self._status.failed(exc)
            raise
        self._status.ok()
        return self._reader.merge(per_service)

    async def watch(self) -> AsyncIterator[list[RuntimeConfig]]:
        if self._closed:
            return
        watch = ConsulWatch(self._reader, self.settings, self._status)
        self._watches.add(watch)
        try:
            async for configs in watch.snapshots():
                yield configs
        finally:
            self._watches.discard(watch)
            await watch.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            await watch.close()
        await self._http.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise RegistryError("the consul registry is closed")


def _check_id(worker_id: str) -> str:
    return f"service:{worker_id}"


def _unknown_check(exc: ConsulHTTPError) -> bool:
    """Consul's answer to passing a check it does not have: 404, or 500 '... does not have associated TTL' (older)."""
    return exc.status == 404 or (exc.status == 500 and "does not have associated TTL" in exc.reason)
