"""The prefill call: one HTTP request to a prefill worker, returning the decode's ``kv_transfer_params``.

Errors, as a tree::

    PrefillError
    ├── PrefillRejected      the worker answered 4xx (not 429): the request itself is bad; the client gets it as is
    └── PrefillUnavailable   429, 5xx, timeout, connection error, or a response without usable transfer params:
                             try another prefill worker, then decode locally (aggregated)
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
from pydantic import ValidationError

from litellm_disagg.transfer.vllm import Endpoint, KVTransferParams

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
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )

    async def prefill(
        self,
        *,
        worker_id: str,
        base_url: str,
        endpoint: Endpoint,
        body: dict[str, Any],
        request_id: str,
        headers: dict[str, str] | None = None,
    ) -> KVTransferParams:
        url = f"{base_url}/{endpoint.value}"
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
        if response.status_code >= 500 or response.status_code != 200:
            raise PrefillUnavailable(f"prefill on {worker_id} answered {response.status_code}", worker_id=worker_id)
        try:
            raw = response.json().get("kv_transfer_params")
            params = KVTransferParams.model_validate(raw) if raw is not None else None
        except (json.JSONDecodeError, AttributeError, ValidationError) as exc:
            raise PrefillUnavailable(f"prefill on {worker_id} returned invalid transfer params: {exc}", worker_id=worker_id) from exc
        if params is None or not params.usable:
            raise PrefillUnavailable(f"prefill on {worker_id} returned no usable kv_transfer_params", worker_id=worker_id)
        return params

    async def aclose(self) -> None:
        await self._client.aclose()
