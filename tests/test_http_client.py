"""The keep-alive race, staged: a server that closes a reused connection without answering the request on it."""

from __future__ import annotations

import asyncio

import httpcore
import httpx
import pytest

from litellm_disagg.http_client import KEEPALIVE_EXPIRY_S, AssignedConnectionGuard, pooled_client

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"


class RacingServer:
    """Answers the first request on every connection and then closes it when the next request arrives, without a
    response: what a client sees when the server's keep-alive timeout fires as the client reuses the connection."""

    def __init__(self) -> None:
        self.connections = 0
        self.answered = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await _read_request(reader)
            writer.write(RESPONSE)
            await writer.drain()
            self.answered += 1
            await _read_request(reader)  # the reused connection's next request: dropped unanswered
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    if length:
        await reader.readexactly(length)


async def test_a_request_dropped_on_a_reused_connection_is_sent_again_on_a_fresh_one() -> None:
    server = RacingServer()
    async with server as url, pooled_client(timeout=10, max_connections=4, max_keepalive_connections=4) as client:
        for i in range(3):
            response = await client.post(f"{url}/v1/completions", json={"i": i})
            assert response.json() == {"ok": True}
    assert server.answered == 3 and server.connections == 3  # each retry on a new connection


async def test_a_plain_client_loses_that_request() -> None:
    server = RacingServer()
    async with server as url, httpx.AsyncClient(timeout=10) as client:
        await client.post(f"{url}/x", json={})
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(f"{url}/x", json={})


def test_idle_connections_expire_before_a_uvicorn_server_closes_them() -> None:
    assert KEEPALIVE_EXPIRY_S < 5.0  # uvicorn's default timeout_keep_alive (vLLM's API server, the LiteLLM proxy)


class _IdleConnection:
    """Stands in for an HTTP/1.1 connection of the pool: idle (its request has not started on it yet)."""

    def __init__(self, *, expired: bool) -> None:
        self.expired = expired

    def can_handle_request(self, origin: object) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def has_expired(self) -> bool:
        return self.expired

    def is_idle(self) -> bool:
        return True

    def is_closed(self) -> bool:
        return False

    async def aclose(self) -> None:
        pass


def _pool_of(client: httpx.AsyncClient) -> httpcore.AsyncConnectionPool:
    transport = client._transport  # FreshConnectionRetry over httpx's transport
    pool = transport._inner._pool  # type: ignore[attr-defined]
    assert isinstance(pool, httpcore.AsyncConnectionPool)
    return pool


def _hand_to_a_request(pool: httpcore.AsyncConnectionPool, connection: _IdleConnection) -> None:
    from httpcore._async.connection_pool import AsyncPoolRequest

    request = AsyncPoolRequest(httpcore.Request("POST", "http://127.0.0.1:1/v1/completions"))
    request.assign_to_connection(connection)  # type: ignore[arg-type]
    pool._requests.append(request)


@pytest.mark.parametrize("case", ["expired", "surplus"])
async def test_a_connection_handed_to_a_request_is_not_closed_by_another_pass(case: str) -> None:
    """encode/httpcore#1110: the pool hands an idle connection to a request, and another request's pass closes it
    (as expired, or as a surplus keep-alive connection) before or while that request runs on it: a prefill the worker
    served and whose answer, and so its KV lease, was lost. A connection no request holds is still closed."""
    async with pooled_client(timeout=10, max_connections=8, max_keepalive_connections=1) as client:
        pool = _pool_of(client)
        held = _IdleConnection(expired=case == "expired")
        spare = _IdleConnection(expired=case == "expired")
        last = _IdleConnection(expired=case == "expired")  # surplus: the pass stops closing at the keep-alive limit
        pool._connections.extend([held, spare, last])  # type: ignore[list-item]
        _hand_to_a_request(pool, held)
        closing = pool._assign_requests_to_connections()
        assert held not in closing and held in pool._connections
        assert spare in closing and spare not in pool._connections
        pool._requests.clear()
        pool._connections.clear()


def test_every_pooled_client_has_the_guard() -> None:
    client = pooled_client(timeout=1, max_connections=2, max_keepalive_connections=2)
    assert isinstance(_pool_of(client), AssignedConnectionGuard)
