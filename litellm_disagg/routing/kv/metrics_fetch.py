"""How the load scraper fetches a worker's ``/metrics`` page: one small seam, two implementations.

- ``AiohttpFetch`` (the default, when no client is injected): aiohttp's client, about a quarter of httpx's CPU per
  request (0.27 ms against 1.0-1.3 ms for one simulated worker's page, measured on the 2-core benchmark machine).
  The scraper fetches every worker's page several times a second on the proxy's event loop (8 workers at 4 Hz: 32
  requests a second, 64 workers: 256), so this is most of the KV arm's fixed CPU cost in the proxy
  (docs/benchmarks.md, "multi-turn: where the KV arm's proxy time went").
- ``HttpxFetch``: an ``httpx.AsyncClient`` the caller owns (tests' mock transports, a client carrying a worker key).

Both send ``Accept-Encoding: identity`` (a compressed page costs the worker and the proxy CPU to save bytes on a
local hop) and raise ``FetchError`` for anything short of a 2xx answer read in full within the timeout. Idle
connections are closed by the client after ``KEEPALIVE_EXPIRY_S`` (before uvicorn's 5 s, see ``http_client.py``); a
page request the server dropped on a reused connection before answering is sent once more (a GET is safe to repeat).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import aiohttp
import httpx

from litellm_disagg.http_client import KEEPALIVE_EXPIRY_S

NO_COMPRESSION = {"Accept-Encoding": "identity"}


class FetchError(Exception):
    """The page could not be read (connection, timeout, HTTP status)."""


class MetricsFetch(Protocol):
    async def text(self, url: str, *, timeout_s: float) -> str: ...

    async def aclose(self) -> None: ...


class HttpxFetch:
    def __init__(self, client: httpx.AsyncClient, *, owned: bool = False):
        self.client = client
        self.owned = owned

    async def text(self, url: str, *, timeout_s: float) -> str:
        try:
            response = await self.client.get(url, timeout=timeout_s, headers=NO_COMPRESSION)
            response.raise_for_status()
            return response.text
        except httpx.HTTPError as exc:
            raise FetchError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        if self.owned:
            await self.client.aclose()


class AiohttpFetch:
    """One ``aiohttp.ClientSession``, created on first use (it belongs to the running event loop)."""

    def __init__(self, *, headers: Mapping[str, str] | None = None, max_connections: int = 256):
        self.headers = {**(headers or {}), **NO_COMPRESSION}
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def text(self, url: str, *, timeout_s: float) -> str:
        session = self._open()
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        for attempt in (1, 2):
            try:
                async with session.get(url, timeout=timeout) as response:
                    if response.status >= 300:
                        raise FetchError(f"HTTP {response.status} from {url}")
                    return await response.text(encoding="utf-8")
            except aiohttp.ServerDisconnectedError as exc:  # the keep-alive race: once more, on a fresh connection
                if attempt == 2:
                    raise FetchError(f"{url}: {exc}") from exc
            except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as exc:
                raise FetchError(f"{url}: {exc!r}") from exc
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, keepalive_timeout=KEEPALIVE_EXPIRY_S, enable_cleanup_closed=False
            )
            self._session = aiohttp.ClientSession(connector=connector, headers=self.headers, auto_decompress=False)
        return self._session


__all__ = ["NO_COMPRESSION", "AiohttpFetch", "FetchError", "HttpxFetch", "MetricsFetch"]
