"""The prefill call: one HTTP request to a prefill worker, returning what its engine's transfer protocol made of the
answer (a ``TransferHandle``).

Errors, as a tree::

    PrefillError
    ├── PrefillRejected      the worker answered 4xx (not 429): the request itself is bad; the client gets it as is
    └── PrefillUnavailable   429, 5xx, timeout, connection error, or a response the protocol finds unusable
                             (not JSON, ``InvalidTransfer``): try another prefill worker, then decode locally
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from litellm_disagg.http_client import pooled_client

from litellm_disagg.engines.base import Endpoint, InvalidTransfer, TransferHandle, TransferProtocol
from litellm_disagg.runtime_config import RuntimeConfig

logger = logging.getLogger(__name__)


class PrefillError(Exception):
    def __init__(self, message: str, *, worker_id: str):
        super().__init__(message)
        self.worker_id = worker_id


class PrefillRejected(PrefillError):
    def __init__(self, message: str, *, worker_id: str, status_code: int, body: str):
        super().__init__(message, worker_id=worker_id)
        self.status_code = status_code
        self.body = body


class PrefillUnavailable(PrefillError):
    pass


class PrefillClient:
    """Sends prefill requests. One pooled ``httpx.AsyncClient`` for all workers."""

    def __init__(self, *, timeout_s: float = 120.0, connect_timeout_s: float = 5.0, client: httpx.AsyncClient | None = None):
        self._client = client or pooled_client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            max_connections=1024,
            max_keepalive_connections=256,
        )

    async def prefill(
        self,
        *,
        worker: RuntimeConfig,
        protocol: TransferProtocol,
        endpoint: Endpoint,
        body: dict[str, Any],
        request_id: str,
        headers: dict[str, str] | None = None,
        handle: TransferHandle | None = None,
    ) -> TransferHandle:
        """POST ``body`` (built by ``protocol.prefill_body``) to ``worker``'s ``endpoint``; the parsed handle.
        ``handle``: what ``protocol.open_transfer`` returned for this attempt (concurrent protocols)."""
        worker_id = worker.worker_id
        url = f"{worker.base_url}/{endpoint.value}"
        try:
            response = await self._client.post(url, json=body, headers={**(headers or {}), "X-Request-Id": request_id})
        except httpx.HTTPError as exc:
            raise PrefillUnavailable(f"prefill on {worker_id} failed: {type(exc).__name__}: {exc}", worker_id=worker_id) from exc
        if 400 <= response.status_code < 500 and response.status_code != 429:
            raise PrefillRejected(
                f"prefill on {worker_id} rejected the request ({response.status_code})",
                worker_id=worker_id,
                status_code=response.status_code,
                body=response.text[:4096],
            )
        if response.status_code != 200:
            raise PrefillUnavailable(f"prefill on {worker_id} answered {response.status_code}", worker_id=worker_id)
        try:
            return protocol.parse_prefill(response.json(), prefill=worker, handle=handle)
        except (json.JSONDecodeError, UnicodeDecodeError, InvalidTransfer) as exc:
            raise PrefillUnavailable(
                f"prefill on {worker_id} returned no usable transfer ({protocol.name}): {exc}", worker_id=worker_id
            ) from exc

    async def post_control(self, worker: RuntimeConfig, path: str, body: dict[str, Any]) -> int | None:
        """POST a control request (an engine's abort) to ``worker``'s server root; its status, None if unreachable.
        Best effort: never raises for the worker's answer or its absence."""
        try:
            response = await self._client.post(f"{worker.server_url}/{path}", json=body)
        except httpx.HTTPError as exc:
            logger.debug("control request %s to %s failed: %s", path, worker.worker_id, exc)
            return None
        return response.status_code

    async def aclose(self) -> None:
        await self._client.aclose()
