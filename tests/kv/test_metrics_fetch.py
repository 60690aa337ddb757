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


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    """``app`` served on 127.0.0.1, a free port: its runner (to clean up) and its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


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
    runner, state.url = await serve(app)
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


async def test_a_worker_key_keeps_the_scraper_on_aiohttp_and_reaches_tokenize(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a worker key the proxy used to hand the KV router one keyed httpx client, so the scraper fell back to
    # httpx (four times aiohttp's CPU per page). The key now goes to the scraper's own session and to the tokenizer's
    # /tokenize fallback client.
    from unittest.mock import MagicMock

    from litellm_disagg.engines.base import Endpoint
    from litellm_disagg.routing.controller import DisaggController
    from litellm_disagg.settings import DisaggSettings

    monkeypatch.setenv("LITELLM_DISAGG_WORKER_API_KEY", "worker-key")
    settings = DisaggSettings(kv_routing={"enabled": True, "tokenizer": {"http_fallback": True}})
    controller = DisaggController(MagicMock(), settings, MagicMock())
    assert controller.worker_key
    kv = controller.kv
    assert kv is not None
    tokenize_seen: list[dict[str, str]] = []

    async def tokenize(request: web.Request) -> web.Response:
        tokenize_seen.append(dict(request.headers))
        return web.json_response({"tokens": [1, 2, 3]})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    runner, tokenize_url = await serve(app)

    sent_by_httpx: list[str] = []
    real_send = httpx.AsyncClient.send

    async def tracking_send(self: httpx.AsyncClient, request: httpx.Request, **kwargs: object) -> httpx.Response:
        sent_by_httpx.append(str(request.url))
        return await real_send(self, request, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(httpx.AsyncClient, "send", tracking_send)
    try:
        kv.scraper.set_targets({"w": server.url})
        await kv.scraper.scrape_once()
        assert not kv.scraper.get("w").stale
        assert server.seen[-1]["Authorization"] == "Bearer worker-key"
        assert not any(url.endswith("/metrics") for url in sent_by_httpx)  # the page came through aiohttp
        ids = await kv.tokenizer.tokenize(
            model="m", endpoint=Endpoint.CHAT, fields={"messages": [{"role": "user", "content": "hi"}]},
            worker_url=tokenize_url,
        )
        assert ids == [1, 2, 3]
        assert tokenize_seen[-1]["Authorization"] == "Bearer worker-key"
    finally:
        await kv.stop()
        await runner.cleanup()
