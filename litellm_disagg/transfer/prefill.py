"""The prefill call: one HTTP request to a prefill worker, returning what its engine's transfer protocol made of the
answer (a ``TransferHandle``).

Errors, as a tree::

    PrefillError
    ├── PrefillRejected      the worker answered 4xx (not 401, 403, 429): the request itself is bad; the client gets
    │                        it as is
    └── PrefillUnavailable   401/403 (the proxy's worker key is wrong: the worker's fault, not the client's), 429,
                             5xx, timeout, connection error, an answer over ``max_answer_bytes``, or one the protocol
                             finds unusable or not the worker's own to give (not JSON, ``InvalidTransfer``): try
                             another prefill worker, then decode locally

``timeout_s`` is a total deadline for one call (connect, send, wait, read): a worker that trickles its answer a byte
at a time cannot hold a request longer. ``api_key``: sent as ``Authorization: Bearer`` to every worker (vLLM's
``--api-key``); never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx

from litellm_disagg.engines.base import Endpoint, InvalidTransfer, TransferHandle, TransferProtocol
from litellm_disagg.http_client import pooled_client
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


class _TooLarge(Exception):
    pass


class PrefillClient:
    """Sends prefill requests. One pooled ``httpx.AsyncClient`` for all workers."""

    def __init__(
        self,
        *,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        client: httpx.AsyncClient | None = None,
        api_key: str | None = None,
        max_answer_bytes: int = 16 * 1024 * 1024,
    ):
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or pooled_client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            max_connections=1024,
            max_keepalive_connections=256,
        )

    def __repr__(self) -> str:  # never the key
        return f"PrefillClient(timeout_s={self.timeout_s}, api_key={'set' if self._auth else 'none'})"

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
        prompt_tokens: int | None = None,
    ) -> TransferHandle:
        """POST ``body`` (built by ``protocol.prefill_body``) to ``worker``'s ``endpoint``; the parsed handle.
        ``handle``: what ``protocol.open_transfer`` returned for this attempt (concurrent protocols);
        ``prompt_tokens``: the prompt's length when the router counted it (bounds the answer)."""
        worker_id = worker.worker_id
        url = f"{worker.base_url}/{endpoint.value}"
        send = {**(headers or {}), **self._auth, "X-Request-Id": request_id}
        try:
            async with asyncio.timeout(self.timeout_s):
                status, content = await self._post(url, body, send)
        except TimeoutError as exc:
            raise PrefillUnavailable(
                f"prefill on {worker_id} failed: no complete answer within {self.timeout_s:g} s", worker_id=worker_id
            ) from exc
        except _TooLarge as exc:
            raise PrefillUnavailable(f"prefill on {worker_id} failed: {exc}", worker_id=worker_id) from exc
        except httpx.HTTPError as exc:
            raise PrefillUnavailable(f"prefill on {worker_id} failed: {type(exc).__name__}: {exc}", worker_id=worker_id) from exc
        if status in (401, 403):
            raise PrefillUnavailable(
                f"prefill on {worker_id} answered {status}: the worker refuses this proxy's key", worker_id=worker_id
            )
        if 400 <= status < 500 and status != 429:
            raise PrefillRejected(
                f"prefill on {worker_id} rejected the request ({status})",
                worker_id=worker_id,
                status_code=status,
                body=content[:4096].decode("utf-8", errors="replace"),
            )
        if status != 200:
            raise PrefillUnavailable(f"prefill on {worker_id} answered {status}", worker_id=worker_id)
        try:
            return protocol.parse_prefill(json.loads(content), prefill=worker, handle=handle, prompt_tokens=prompt_tokens)
        except (json.JSONDecodeError, UnicodeDecodeError, InvalidTransfer) as exc:
            raise PrefillUnavailable(
                f"prefill on {worker_id} returned no usable transfer ({protocol.name}): {exc}", worker_id=worker_id
            ) from exc

    async def _post(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
        """The answer's status and body, read up to ``max_answer_bytes``."""
        async with self._client.stream("POST", url, json=body, headers=headers) as response:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self.max_answer_bytes:
                    raise _TooLarge(f"an answer over {self.max_answer_bytes} bytes")
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)

    async def post_control(self, worker: RuntimeConfig, path: str, body: dict[str, Any]) -> int | None:
        """POST a control request (an engine's abort) to ``worker``'s server root; its status, None if unreachable.
        Best effort: never raises for the worker's answer or its absence."""
        try:
            response = await self._client.post(f"{worker.server_url}/{path}", json=body, headers=self._auth)
        except httpx.HTTPError as exc:
            logger.debug("control request %s to %s failed: %s", path, worker.worker_id, exc)
            return None
        return response.status_code

    async def aclose(self) -> None:
        await self._client.aclose()
