"""A small async client for the part of Consul's HTTP API the registry uses, on ``httpx.AsyncClient``.

Every request carries the token header, ``?dc=``/``?ns=`` where they apply, and the TLS server name; every answer
comes back as a ``ConsulResponse`` with the ``X-Consul-Index`` already parsed. Failures are mapped once, here::

    RegistryError                      (discovery/registry.py)
     └── ConsulError
          ├── ConsulUnreachable        connection refused or reset, timeout, TLS failure: Consul did not answer
          └── ConsulHTTPError          Consul answered with an unexpected status (.status, .reason)
               └── ConsulDenied        403: ACL not found, or permission denied

Why our own client on httpx rather than py-consul: see the package docstring. A typed thin layer is also easier to
test against a double than a wrapped client.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from litellm_disagg.discovery.consul.endpoint import ConsulEndpoint
from litellm_disagg.discovery.registry import RegistryError


class ConsulError(RegistryError):
    """A request to Consul failed."""


class ConsulUnreachable(ConsulError):
    """Consul did not answer (connection refused or dropped, timeout, TLS handshake failure)."""


class ConsulHTTPError(ConsulError):
    """Consul answered with a status the caller did not expect."""

    def __init__(self, method: str, path: str, status: int, reason: str):
        self.status = status
        self.reason = reason
        super().__init__(f"consul {method} {path}: HTTP {status}: {reason}")


class ConsulDenied(ConsulHTTPError):
    """403 from Consul: the ACL token is unknown ('ACL not found') or lacks a permission ('Permission denied')."""


@dataclass(frozen=True)
class ConsulResponse:
    status: int
    body: Any
    """Parsed JSON, or ``None`` for an empty or non-JSON body."""
    index: int | None
    """``X-Consul-Index``, when the endpoint sent one."""
    filtered_by_acls: bool
    """``X-Consul-Results-Filtered-By-ACLs: true``: the token could not see every result."""


class ConsulHttp:
    def __init__(self, endpoint: ConsulEndpoint, *, timeout_s: float):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(**endpoint.client_kwargs(timeout_s))

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        content: bytes | None = None,
        accept: Collection[int] = (200,),
        timeout_s: float | None = None,
        datacenter: bool = True,
    ) -> ConsulResponse:
        """Send one request. A status outside ``accept`` raises ``ConsulHTTPError``, no answer ``ConsulUnreachable``."""
        if self._client.is_closed:
            raise ConsulError("the consul client is closed")
        query = self.endpoint.scope_params(datacenter=datacenter)
        query.update(params or {})
        try:
            response = await self._client.request(
                method,
                path,
                params=query,
                json=json_body,
                content=content,
                timeout=timeout_s if timeout_s is not None else self.timeout_s,
                extensions=self.endpoint.request_extensions(),
            )
        except httpx.TransportError as exc:  # connect, read, write, timeout, protocol and TLS errors
            raise ConsulUnreachable(f"consul at {self.endpoint.base_url} unreachable: {_describe(exc)}") from exc
        if response.status_code not in accept:
            reason = " ".join(response.text.split())[:300] or response.reason_phrase
            error = ConsulDenied if response.status_code == 403 else ConsulHTTPError
            raise error(method, path, response.status_code, reason)
        return ConsulResponse(
            status=response.status_code,
            body=_json_or_none(response.content),
            index=_index(response.headers.get("X-Consul-Index")),
            filtered_by_acls=response.headers.get("X-Consul-Results-Filtered-By-ACLs", "").lower() == "true",
        )

    async def aclose(self) -> None:
        await self._client.aclose()


def _json_or_none(content: bytes) -> Any:
    if not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return None


def _index(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
