"""HTTP clients for the hops litellm-disagg owns: router → worker (prefill, ``/metrics``, ``/tokenize``) and the
benchmarks' clients → proxy.

The keep-alive race: a server closes an idle connection (uvicorn, under vLLM and the LiteLLM proxy, after 5 s) just as
a client takes it from its pool for the next request. The client then gets "Server disconnected without sending a
response" (``httpx.RemoteProtocolError``) for a request the server never read. Two defences, both here:

- idle connections are dropped by the client first: ``KEEPALIVE_EXPIRY_S`` (2 s) is shorter than any server's
  keep-alive timeout we talk to (uvicorn's default 5 s; the simulator's 30 s);
- a request that failed that way, with nothing received, is sent once more on a fresh connection
  (``FreshConnectionRetry``). Only for that error: a timeout, a reset after the response started, or an HTTP status
  is the caller's to handle.
"""

from __future__ import annotations

import logging

import httpx

logger = logging.getLogger(__name__)

KEEPALIVE_EXPIRY_S = 2.0


class FreshConnectionRetry(httpx.AsyncBaseTransport):
    """Resend a request once when the server closed its (reused) connection without answering."""

    def __init__(self, inner: httpx.AsyncBaseTransport):
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._inner.handle_async_request(request)
        except httpx.RemoteProtocolError as exc:
            if not _replayable(request):
                raise
            logger.debug("%s %s: %s; resending on a fresh connection", request.method, request.url, exc)
            return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _replayable(request: httpx.Request) -> bool:
    """A body already in memory (``json=``, ``content=`` bytes) can be sent again; a streamed one cannot."""
    try:
        request.content  # noqa: B018 (raises RequestNotRead for a streaming body)
    except httpx.RequestNotRead:
        return False
    return True


def pooled_client(
    *,
    timeout: httpx.Timeout | float,
    max_connections: int,
    max_keepalive_connections: int,
    base_url: str = "",
    headers: dict[str, str] | None = None,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` safe against the keep-alive race (see the module docstring). ``headers``: sent with
    every request (a worker API key)."""
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_keepalive_connections,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
    transport = FreshConnectionRetry(httpx.AsyncHTTPTransport(limits=limits))
    return httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits, transport=transport, headers=headers)
