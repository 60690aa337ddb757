"""The load scraper's own page fetch (``metrics_fetch.py``): aiohttp, not httpx, against a real local HTTP server;
the worker key and ``Accept-Encoding: identity`` go with every page request; a failed fetch keeps the last values
marked stale."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from aiohttp import web

from litellm_disagg.routing.kv.load_scraper import LoadScraper, ScrapedLoad
from tests.kv.test_load import PAGE


@dataclass
class Server:
    url: str
    status: int = 200
    seen: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server(url="")

    async def metrics(request: web.Request) -> web.Response:
        state.seen.append(dict(request.headers))
        if state.status != 200:
            return web.Response(status=state.status)
        return web.Response(text=PAGE, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


async def test_the_default_scraper_reads_pages_without_httpx(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx costs about four times aiohttp's CPU per page on the proxy's event loop: the scraper's own client is not
    # httpx (an httpx request here would fail the scrape).
    async def no_httpx(*_: object, **__: object) -> httpx.Response:
        raise httpx.ConnectError("httpx used")

    monkeypatch.setattr(httpx.AsyncClient, "send", no_httpx)
    scraper = LoadScraper(headers={"Authorization": "Bearer worker-key"})
    scraper.set_targets({"w": server.url})
    try:
        for _ in range(3):  # the kept-alive connection is reused
            await scraper.scrape_once()
        load = scraper.get("w")
        assert (load.waiting, load.running, load.kv_usage, load.stale) == (5.0, 4.0, 0.375, False)
        assert len(server.seen) == 3
        for headers in server.seen:
            assert headers["Authorization"] == "Bearer worker-key"
            assert headers["Accept-Encoding"] == "identity"
    finally:
        await scraper.stop()


async def test_a_failed_page_keeps_the_last_values_marked_stale(server: Server) -> None:
    scraper = LoadScraper(timeout_s=2.0)
    scraper.set_targets({"w": server.url, "gone": "http://127.0.0.1:9"})  # nothing listens on port 9
    try:
        await scraper.scrape_once()
        assert not scraper.get("w").stale and scraper.get("gone") == ScrapedLoad()
        server.status = 503
        await scraper.scrape_once()
        load = scraper.get("w")
        assert load.stale and (load.waiting, load.running) == (5.0, 4.0)
        server.status = 200
        await scraper.scrape_once()
        assert not scraper.get("w").stale
    finally:
        await scraper.stop()


async def test_an_injected_httpx_client_asks_for_an_uncompressed_page() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("accept-encoding"))
        return httpx.Response(200, text=PAGE)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    scraper = LoadScraper(client=client)
    scraper.set_targets({"w": "http://a"})
    await scraper.scrape_once()
    await scraper.stop()
    assert seen == ["identity"] and not client.is_closed  # the caller's client stays open
    await client.aclose()
