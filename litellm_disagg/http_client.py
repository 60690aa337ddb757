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

The pool's own race (httpcore 1.0.9, encode/httpcore#1110): the pool hands an idle connection to a waiting request,
which starts on it only when its task next runs; meanwhile another request's pass over the pool still sees the
connection idle and closes it (as expired, as a surplus keep-alive connection, or to make room). If the waiting request
has sent its body by the time the close lands, the client gets ``ReadError`` (``ClosedResourceError``) for a request
the server received and served. For a prefill that is the worst case: the worker computed the prompt and holds its KV
for a decode that will never come, and the router, without the answer, cannot release it (vLLM names the blocks by an
internal request id only the answer carries). Seen in the soak, 300 clients: 0-2 prefills per 1,000 requests, each one
prefill lease held until the engine's timeout (docs/benchmarks.md). In 1.0.9 the surplus test also counts every
connection, not only idle ones, so with more connections open than ``max_keepalive_connections`` every idle connection
is closed on every pass. ``AssignedConnectionGuard`` keeps a connection that a request of the pool holds out of what
a pass closes; ``pooled_client`` installs it on its transport's pool.
"""

from __future__ import annotations

import logging
from typing import Any

import httpcore
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


class AssignedConnectionGuard(httpcore.AsyncConnectionPool):
    """httpcore's pool, except that a connection handed to one of its requests is never closed by another request's
    pass over the pool (see the module docstring). A connection it would have closed as expired or surplus stays;
    the request on it gets the server's answer, or, if the server closed it meanwhile, the keep-alive race that
    ``FreshConnectionRetry`` handles."""

    def _assign_requests_to_connections(self) -> list[Any]:
        closing: list[Any] = super()._assign_requests_to_connections()
        if not closing:
            return closing
        held = {id(r.connection) for r in self._requests if r.connection is not None}
        kept = [c for c in closing if id(c) in held]
        if not kept:
            return closing
        self._connections.extend(kept)
        return [c for c in closing if id(c) not in held]


def _guard_pool(transport: httpx.AsyncHTTPTransport) -> None:
    """Make ``transport``'s pool an ``AssignedConnectionGuard`` (same state, same settings) when it is the httpcore
    pool this was written against; any other is left as it is."""
    pool = getattr(transport, "_pool", None)
    if type(pool) is httpcore.AsyncConnectionPool and hasattr(pool, "_requests"):
        pool.__class__ = AssignedConnectionGuard
    else:
        logger.warning(
            "httpcore pool %s not guarded: a request may lose its answer to encode/httpcore#1110", type(pool).__name__
        )


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
    inner = httpx.AsyncHTTPTransport(limits=limits)
    _guard_pool(inner)
    transport = FreshConnectionRetry(inner)
    return httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits, transport=transport, headers=headers)
