"""ConsulDouble: a TEST DOUBLE of Consul's HTTP API. It is not Consul, and nothing outside the tests may use it.

No Consul agent or server can be installed on the machines this project is built and tested on, so the Consul
registry backend is tested against this in-process asyncio HTTP server (plain asyncio streams, HTTP/1.1 with
keep-alive), bound to 127.0.0.1 on a free port. It implements exactly the endpoints the backend uses, with the
semantics Consul documents for them:

Agent (one agent, one node ``node-1`` in datacenter ``dc1``)
    ``PUT /v1/agent/service/register[?replace-existing-checks]``: ID (defaults to Name), Name, Tags, Address, Port,
    Meta, Check/Checks (TTL, or HTTP + Interval [+ Timeout]), Status (initial; default critical), CheckID (default
    ``service:<id>``), DeregisterCriticalServiceAfter. Meta is validated like Consul: at most 64 pairs, keys of at
    most 128 characters of ``[A-Za-z0-9_-]`` (a dot gives 400 'Key contains invalid characters') without the
    ``consul-`` prefix, values of at most 512 bytes.
    ``PUT /v1/agent/service/deregister/:id`` (404 for an unknown ID), ``GET /v1/agent/service/:id``,
    ``PUT /v1/agent/check/pass/:check_id[?note=]`` (404 unknown, 500 for a check without TTL).
    TTL checks turn critical when not passed within their TTL; HTTP checks are polled every Interval (2xx passing,
    429 warning, anything else critical); a check critical for longer than its DeregisterCriticalServiceAfter
    (never less than ``min_deregister_critical_s``, checked every ``reap_interval_s``: 60 s and 30 s as in Consul,
    shortened by tests) has its service deregistered.

Catalog and health
    ``GET /v1/catalog/services`` (name -> tags, ``consul`` itself included), ``GET /v1/health/service/:name``
    with ``?passing`` (only instances whose checks all pass, node check included) and ``?tag``.

KV
    ``GET /v1/kv/:key`` (base64 ``Value``, ``CreateIndex``/``ModifyIndex``/``Flags``/``LockIndex``; 404 when
    missing; ``?recurse``, ``?keys[&separator]``, ``?raw``), ``PUT /v1/kv/:key`` (raw body, ``true``/``false``,
    ``?cas=`` with 0 meaning create-only, ``?flags=``, 512 KiB limit -> 413), ``DELETE /v1/kv/:key``
    (``?recurse``, ``?cas=``).

Sessions and locks
    ``PUT /v1/session/create`` (Name, TTL between ``min_session_ttl_s`` and 24 h else 400, Behavior ``release`` or
    ``delete``, LockDelay; answers ``{"ID": ...}``), ``PUT /v1/session/renew/:id`` (the session in a list; 404 when
    it is gone), ``PUT /v1/session/destroy/:id``, ``GET /v1/session/info/:id``. A session not renewed within its TTL
    is invalidated (Consul takes between one and two TTLs; the double exactly one). ``PUT /v1/kv/:key?acquire=<id>``
    (true when the key is free or already held by that session; 500 for an unknown session; refused during a lock
    delay that followed an invalidation), ``?release=<id>`` (true only for the holder). An invalidated session's keys
    are released (``Behavior: release``) or deleted (``delete``). Reads show ``Session`` and ``LockIndex``.

Everywhere
    One raft-like index that only grows; every read answers ``X-Consul-Index`` (the index of what it read). Reads
    are blocking queries with ``?index=N&wait=D``: held until that index exceeds N or the wait (default 5 m, at most
    10 m) ends. Unlike Consul, no random jitter is added to the wait (determinism). ``?dc=`` other than ``dc1`` ->
    500 'No path to datacenter'; ``?ns=`` is accepted and recorded, not enforced; ``?filter=`` -> 400 (not
    implemented here). With ``acl_token`` set: an unknown token (``X-Consul-Token``, ``Authorization: Bearer`` or
    ``?token=``) gets 403 'ACL not found'; no token means the anonymous token, which gets 403 'Permission denied'
    on writes and single-key reads, and empty results with ``X-Consul-Results-Filtered-By-ACLs: true`` on listings.

Test controls (not part of Consul)
    ``requests`` (every request seen), ``registrations`` (every register body), ``stop()`` / ``start()`` /
    ``restart(lose_agent_state=...)`` on the same port (an outage: open connections are dropped too),
    ``reset_index(to)`` (the index goes backwards, as after a snapshot restore), ``zero_index`` (indexes stuck at 0
    and answered as ``X-Consul-Index: 0``, an old Consul bug), ``tls`` (serve https).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx

MAX_BLOCKING_WAIT_S = 600.0
DEFAULT_BLOCKING_WAIT_S = 300.0
KV_MAX_BYTES = 512 * 1024
_META_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_STATUS_TEXT = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
                413: "Request Entity Too Large", 500: "Internal Server Error"}


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def parse_go_duration(text: str) -> float:
    """Go's ``time.ParseDuration`` (the subset Consul takes: ``10s``, ``1m30s``, ``250ms``) -> seconds."""
    text = text.strip()
    if text in ("0", ""):
        return 0.0
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position != len(text) or position == 0:
        raise HTTPError(400, f'time: invalid duration "{text}"')
    return total


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class _Check:
    check_id: str
    name: str
    service_id: str
    status: str
    ttl_s: float | None = None
    http: str | None = None
    method: str = "GET"
    interval_s: float = 10.0
    timeout_s: float = 10.0
    deregister_after_s: float | None = None
    output: str = ""
    critical_since: float | None = None
    create_index: int = 0
    modify_index: int = 0
    timer: asyncio.TimerHandle | None = None
    poller: asyncio.Task[None] | None = None

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.poller is not None:
            self.poller.cancel()

    @property
    def kind(self) -> str:
        return "ttl" if self.ttl_s is not None else "http"


@dataclass
class _Service:
    service_id: str
    name: str
    tags: list[str]
    meta: dict[str, str]
    address: str
    port: int
    check_ids: list[str] = field(default_factory=list)
    create_index: int = 0
    modify_index: int = 0


@dataclass
class _KvEntry:
    value: bytes | None
    flags: int
    create_index: int
    modify_index: int
    session: str | None = None
    lock_index: int = 0


@dataclass
class _Session:
    session_id: str
    name: str
    ttl_s: float | None
    behavior: str
    lock_delay_s: float
    create_index: int
    timer: asyncio.TimerHandle | None = None


@dataclass
class _Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class _Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    index: int | None = None
    filtered: bool = False


class ConsulDouble:
    """See the module docstring. Use ``async with ConsulDouble() as consul:`` or ``start()``/``stop()``."""

    def __init__(
        self,
        *,
        acl_token: str | None = None,
        datacenter: str = "dc1",
        node: str = "node-1",
        reap_interval_s: float = 30.0,
        min_deregister_critical_s: float = 60.0,
        tls: ssl.SSLContext | None = None,
        min_session_ttl_s: float = 10.0,
    ):
        self.acl_token = acl_token
        self.datacenter = datacenter
        self.node = node
        self.reap_interval_s = reap_interval_s
        self.min_deregister_critical_s = min_deregister_critical_s
        self.tls = tls
        self.zero_index = False
        self.requests: list[SeenRequest] = []
        self.registrations: list[dict[str, Any]] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._index = 1
        self._changed = asyncio.Event()
        self._services: dict[str, _Service] = {}
        self._checks: dict[str, _Check] = {}
        self._service_index: dict[str, int] = {}
        self._catalog_index = 1
        self._kv: dict[str, _KvEntry] = {}
        self._kv_tombstones: dict[str, int] = {}
        self._kv_table_index = 1
        self._http_client: httpx.AsyncClient | None = None
        self.min_session_ttl_s = min_session_ttl_s
        self._sessions: dict[str, _Session] = {}
        self._lock_delay_until: dict[str, float] = {}
        self._session_counter = 0

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}"

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Listen on 127.0.0.1 (a free port the first time, the same port after a stop)."""
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever(), name="consul-double-reaper")
        if self._http_client is None:
            self._http_client = httpx.AsyncClient(trust_env=False)

    async def stop(self) -> None:
        """Stop answering: close the listener and drop every open connection (blocked queries included).

        The agent's state and timers carry on, as in a network outage: TTLs still expire meanwhile.
        """
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task, writer in list(self._connections.items()):
            writer.transport.abort()
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._connections.clear()
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def restart(self, *, lose_agent_state: bool = False) -> None:
        """Stop, then listen again on the same port. ``lose_agent_state``: the agent forgot its services and checks
        (an agent restarted without persisted state); the KV store lives on the servers and stays."""
        await self.stop()
        if lose_agent_state:
            names = tuple({service.name for service in self._services.values()})
            for check in self._checks.values():
                check.stop()
            self._services.clear()
            self._checks.clear()
            self._bump(services=names, catalog=True)
        await self.start()

    async def close(self) -> None:
        """Stop for good: the listener, connections, timers, pollers and the reaper."""
        await self.stop()
        for check in self._checks.values():
            check.stop()
        for session in self._sessions.values():
            if session.timer is not None:
                session.timer.cancel()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        if self._http_client is not None:
            await self._http_client.aclose()
            self._http_client = None

    async def __aenter__(self) -> ConsulDouble:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- test controls -----------------------------------------------------------------------------------------------

    def reset_index(self, to: int = 1) -> None:
        """Make every index go back to ``to`` (as after a snapshot restore); later writes count up from there."""
        self._index = to
        self._catalog_index = to
        self._kv_table_index = to
        self._service_index = {name: to for name in self._service_index}
        self._kv_tombstones = {key: to for key in self._kv_tombstones}
        for entry in self._kv.values():
            entry.create_index = entry.modify_index = to
        self._notify()

    def seen(self, method: str | None = None, path_prefix: str = "") -> list[SeenRequest]:
        return [r for r in self.requests if (method is None or r.method == method) and r.path.startswith(path_prefix)]

    def service_ids(self) -> set[str]:
        return set(self._services)

    def agent_service(self, service_id: str) -> dict[str, Any] | None:
        service = self._services.get(service_id)
        return self._service_json(service) if service is not None else None

    def kv_keys(self, prefix: str = "") -> list[str]:
        return sorted(key for key in self._kv if key.startswith(prefix))

    def check_status(self, check_id: str) -> str | None:
        check = self._checks.get(check_id)
        return check.status if check is not None else None

    # -- HTTP plumbing -----------------------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            while self._server is not None:
                request = await _read_request(reader)
                if request is None:
                    break
                response = await self._respond(request)
                writer.write(_encode_response(response))
                await writer.drain()
                if request.headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, ValueError):
            pass
        except asyncio.CancelledError:
            pass  # stop() ended this connection; finishing normally keeps asyncio's stream callback quiet
        finally:
            self._connections.pop(task, None)
            writer.transport.abort()

    async def _respond(self, request: _Request) -> _Response:
        self.requests.append(SeenRequest(request.method, request.path, dict(request.query), dict(request.headers)))
        try:
            response = await self._dispatch(request)
        except HTTPError as exc:
            response = _Response(status=exc.status, body=exc.message.encode(), content_type="text/plain")
        if response.index is not None and self.zero_index:
            response.index = 0
        return response

    async def _dispatch(self, request: _Request) -> _Response:
        dc = request.query.get("dc")
        if dc and dc != self.datacenter:
            raise HTTPError(500, "No path to datacenter")
        if "filter" in request.query:
            raise HTTPError(400, "?filter is not implemented by this test double")
        anonymous = self._authenticate(request)
        method, path = request.method, request.path
        routes: list[tuple[str, str, Callable[[_Request, re.Match[str], bool], Any]]] = [
            ("PUT", r"/v1/agent/service/register", self._register),
            ("PUT", r"/v1/agent/service/deregister/(?P<id>.+)", self._deregister),
            ("GET", r"/v1/agent/service/(?P<id>.+)", self._agent_service),
            ("PUT", r"/v1/agent/check/pass/(?P<id>.+)", self._check_pass),
            ("GET", r"/v1/catalog/services", self._catalog_services),
            ("GET", r"/v1/health/service/(?P<name>.+)", self._health_service),
            ("GET", r"/v1/kv/(?P<key>.*)", self._kv_get),
            ("PUT", r"/v1/kv/(?P<key>.*)", self._kv_put),
            ("DELETE", r"/v1/kv/(?P<key>.*)", self._kv_delete),
            ("PUT", r"/v1/session/create", self._session_create),
            ("PUT", r"/v1/session/renew/(?P<id>.+)", self._session_renew),
            ("PUT", r"/v1/session/destroy/(?P<id>.+)", self._session_destroy),
            ("GET", r"/v1/session/info/(?P<id>.+)", self._session_info),
        ]
        path_matched = False
        for route_method, pattern, handler in routes:
            match = re.fullmatch(pattern, path)
            if match is None:
                continue
            path_matched = True
            if route_method == method:
                result: _Response = await handler(request, match, anonymous)
                return result
        if path_matched:
            raise HTTPError(405, f"method {method} not allowed")
        raise HTTPError(404, f"{path} is not implemented by this test double")

    def _authenticate(self, request: _Request) -> bool:
        """Returns whether the request runs as the anonymous token. Raises 403 for an unknown token."""
        if self.acl_token is None:
            return False
        token = request.headers.get("x-consul-token") or request.query.get("token")
        authorization = request.headers.get("authorization", "")
        if not token and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        if not token:
            return True
        if token != self.acl_token:
            raise HTTPError(403, "ACL not found")
        return False

    # -- index and blocking ------------------------------------------------------------------------------------------

    def _bump(self, *, services: tuple[str, ...] = (), catalog: bool = False, kv_keys: tuple[str, ...] = ()) -> int:
        self._index += 1
        for name in services:
            self._service_index[name] = self._index
        if catalog:
            self._catalog_index = self._index
        if kv_keys:
            self._kv_table_index = self._index
        self._notify()
        return self._index

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _block(self, request: _Request, current: Callable[[], int]) -> None:
        """Hold a read until ``current()`` exceeds ``?index`` or ``?wait`` ends (Consul's blocking query)."""
        raw_index = request.query.get("index")
        if not raw_index:
            return
        try:
            min_index = int(raw_index)
        except ValueError as exc:
            raise HTTPError(400, f"Invalid index: {raw_index!r}") from exc
        if min_index <= 0:
            return
        if self.zero_index:
            current = _zero  # the resource's index really is 0 (the old bug): nothing ever exceeds ?index
        wait_s = DEFAULT_BLOCKING_WAIT_S
        if "wait" in request.query:
            wait_s = min(parse_go_duration(request.query["wait"]), MAX_BLOCKING_WAIT_S)
        deadline = time.monotonic() + wait_s
        while current() <= min_index:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    # -- agent -------------------------------------------------------------------------------------------------------

    async def _register(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        if anonymous:
            raise HTTPError(403, "Permission denied: anonymous token lacks permission 'service:write'")
        body = _json_body(request)
        if not isinstance(body, dict):
            raise HTTPError(400, "Request decode failed: expected a JSON object")
        self.registrations.append(body)
        name = body.get("Name")
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "Missing service name")
        service_id = body.get("ID") or name
        tags = body.get("Tags") or []
        meta = body.get("Meta") or {}
        port = body.get("Port") or 0
        address = body.get("Address") or ""
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise HTTPError(400, "Request decode failed: Tags must be a list of strings")
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise HTTPError(400, "Request decode failed: Meta must map strings to strings")
        if not isinstance(port, int) or isinstance(port, bool) or not isinstance(address, str):
            raise HTTPError(400, "Request decode failed: bad Port or Address")
        problem = _meta_problem(meta)
        if problem is not None:
            raise HTTPError(400, f"Invalid Service Meta: {problem}")
        definitions = ([body["Check"]] if body.get("Check") else []) + list(body.get("Checks") or [])
        checks = [self._new_check(d, service_id, n, len(definitions)) for n, d in enumerate(definitions, start=1)]

        old = self._services.get(service_id)
        replace = request.query.get("replace-existing-checks", "false").lower() in ("", "1", "true")
        kept: list[str] = []
        if old is not None:
            for check_id in old.check_ids:
                if replace or any(c.check_id == check_id for c in checks):
                    dropped = self._checks.pop(check_id, None)
                    if dropped is not None:
                        dropped.stop()
                else:
                    kept.append(check_id)
        index = self._bump(services=(name, old.name) if old is not None else (name,), catalog=True)
        service = _Service(service_id, name, list(tags), dict(meta), address, port,
                           check_ids=kept + [c.check_id for c in checks],
                           create_index=old.create_index if old is not None else index, modify_index=index)
        self._services[service_id] = service
        for check in checks:
            check.create_index = check.modify_index = index
            self._checks[check.check_id] = check
            self._arm(check)
        return _Response(body=b"")

    def _new_check(self, definition: Any, service_id: str, number: int, count: int) -> _Check:
        if not isinstance(definition, dict):
            raise HTTPError(400, "Request decode failed: a check must be an object")
        default_id = f"service:{service_id}" if count == 1 else f"service:{service_id}:{number}"
        status = definition.get("Status") or "critical"
        if status not in ("passing", "warning", "critical"):
            raise HTTPError(400, f"Invalid check status: {status!r}")
        check = _Check(
            check_id=definition.get("CheckID") or definition.get("ID") or default_id,
            name=definition.get("Name") or f"Service '{service_id}' check",
            service_id=service_id,
            status=status,
        )
        if definition.get("DeregisterCriticalServiceAfter"):
            check.deregister_after_s = parse_go_duration(str(definition["DeregisterCriticalServiceAfter"]))
        if definition.get("TTL"):
            check.ttl_s = parse_go_duration(str(definition["TTL"]))
            if check.ttl_s <= 0:
                raise HTTPError(400, "Invalid check: TTL must be > 0 for TTL checks")
        elif definition.get("HTTP"):
            check.http = str(definition["HTTP"])
            check.method = str(definition.get("Method") or "GET")
            check.interval_s = parse_go_duration(str(definition.get("Interval") or "0"))
            if check.interval_s <= 0:
                raise HTTPError(400, "Invalid check: Interval must be > 0 for HTTP checks")
            if definition.get("Timeout"):
                check.timeout_s = parse_go_duration(str(definition["Timeout"]))
        else:
            raise HTTPError(400, "Invalid check: this double implements TTL and HTTP checks only")
        if status == "critical":
            check.critical_since = time.monotonic()
        return check

    def _arm(self, check: _Check) -> None:
        loop = asyncio.get_running_loop()
        if check.ttl_s is not None:
            check.timer = loop.call_later(check.ttl_s, self._ttl_expired, check.check_id)
        else:
            check.poller = asyncio.create_task(self._poll_http(check), name=f"consul-double-http-{check.check_id}")

    def _ttl_expired(self, check_id: str) -> None:
        check = self._checks.get(check_id)
        if check is not None:
            self._set_status(check, "critical", f"TTL expired (last pass more than {check.ttl_s}s ago)")

    async def _poll_http(self, check: _Check) -> None:
        assert check.http is not None
        while True:
            try:
                assert self._http_client is not None
                response = await self._http_client.request(check.method, check.http, timeout=check.timeout_s)
                code = response.status_code
                status = "passing" if 200 <= code < 300 else "warning" if code == 429 else "critical"
                output = f"HTTP {check.method} {check.http}: {code}"
            except httpx.HTTPError as exc:
                status, output = "critical", f"HTTP {check.method} {check.http}: {type(exc).__name__}"
            self._set_status(check, status, output)
            await asyncio.sleep(check.interval_s)

    def _set_status(self, check: _Check, status: str, output: str) -> None:
        check.output = output
        if status == check.status:
            return  # the agent syncs a status change, not a repeated one: no index bump
        check.status = status
        check.critical_since = time.monotonic() if status == "critical" else None
        service = self._services.get(check.service_id)
        check.modify_index = self._bump(services=(service.name,) if service is not None else ())

    async def _deregister(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        if anonymous:
            raise HTTPError(403, "Permission denied: anonymous token lacks permission 'service:write'")
        service_id = unquote(match["id"])
        if service_id not in self._services:
            raise HTTPError(
                404, f'Unknown service ID "{service_id}". Ensure that the service ID is passed, not the service name.'
            )
        self._remove_service(service_id)
        return _Response(body=b"")

    def _remove_service(self, service_id: str) -> None:
        service = self._services.pop(service_id)
        for check_id in service.check_ids:
            check = self._checks.pop(check_id, None)
            if check is not None:
                check.stop()
        self._bump(services=(service.name,), catalog=True)

    async def _agent_service(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        if anonymous:
            raise HTTPError(403, "Permission denied: anonymous token lacks permission 'service:read'")
        service = self._services.get(unquote(match["id"]))
        if service is None:
            raise HTTPError(404, f"unknown service ID: {unquote(match['id'])}")
        return _json_response(self._service_json(service))

    async def _check_pass(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        if anonymous:
            raise HTTPError(403, "Permission denied: anonymous token lacks permission 'service:write'")
        check_id = unquote(match["id"])
        check = self._checks.get(check_id)
        if check is None:
            raise HTTPError(
                404, f'Unknown check ID "{check_id}". Ensure that the check ID is passed, not the check name.'
            )
        if check.ttl_s is None:
            raise HTTPError(500, f'CheckID "{check_id}" does not have associated TTL')
        if check.timer is not None:
            check.timer.cancel()
        check.timer = asyncio.get_running_loop().call_later(check.ttl_s, self._ttl_expired, check_id)
        self._set_status(check, "passing", request.query.get("note", ""))
        return _Response(body=b"")

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval_s)
            now = time.monotonic()
            for check in list(self._checks.values()):
                if check.deregister_after_s is None or check.critical_since is None or check.status != "critical":
                    continue
                limit = max(check.deregister_after_s, self.min_deregister_critical_s)
                if now - check.critical_since >= limit and check.service_id in self._services:
                    self._remove_service(check.service_id)

    # -- catalog and health ------------------------------------------------------------------------------------------

    async def _catalog_services(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        await self._block(request, lambda: self._catalog_index)
        if anonymous:
            return _json_response({}, index=self._catalog_index, filtered=True)
        listing: dict[str, set[str]] = {"consul": set()}
        for service in self._services.values():
            listing.setdefault(service.name, set()).update(service.tags)
        return _json_response({name: sorted(tags) for name, tags in sorted(listing.items())}, index=self._catalog_index)

    async def _health_service(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        name = unquote(match["name"])

        def index() -> int:
            return self._service_index.get(name, self._catalog_index)

        await self._block(request, index)
        if anonymous:
            return _json_response([], index=index(), filtered=True)
        passing_only = _flag(request.query, "passing")
        tag = request.query.get("tag")
        entries = []
        for service in sorted(self._services.values(), key=lambda s: s.service_id):
            if service.name != name or (tag is not None and tag not in service.tags):
                continue
            checks = [self._check_json(None)] + [self._check_json(self._checks[c]) for c in service.check_ids]
            if passing_only and any(c["Status"] != "passing" for c in checks):
                continue
            entries.append({"Node": self._node_json(), "Service": self._service_json(service), "Checks": checks})
        return _json_response(entries, index=index())

    def _node_json(self) -> dict[str, Any]:
        return {"ID": "00000000-0000-4000-8000-000000000001", "Node": self.node, "Address": "127.0.0.1",
                "Datacenter": self.datacenter, "TaggedAddresses": {"lan": "127.0.0.1", "wan": "127.0.0.1"},
                "Meta": {"consul-network-segment": ""}, "CreateIndex": 1, "ModifyIndex": 1}

    def _service_json(self, service: _Service) -> dict[str, Any]:
        return {"ID": service.service_id, "Service": service.name, "Tags": list(service.tags),
                "Address": service.address, "Meta": dict(service.meta), "Port": service.port,
                "Weights": {"Passing": 1, "Warning": 1}, "EnableTagOverride": False, "Datacenter": self.datacenter,
                "CreateIndex": service.create_index, "ModifyIndex": service.modify_index}

    def _check_json(self, check: _Check | None) -> dict[str, Any]:
        if check is None:  # the node's own check: this agent is alive
            return {"Node": self.node, "CheckID": "serfHealth", "Name": "Serf Health Status", "Status": "passing",
                    "Notes": "", "Output": "Agent alive and reachable", "ServiceID": "", "ServiceName": "",
                    "ServiceTags": [], "Type": "", "CreateIndex": 1, "ModifyIndex": 1}
        service = self._services[check.service_id]
        return {"Node": self.node, "CheckID": check.check_id, "Name": check.name, "Status": check.status,
                "Notes": "", "Output": check.output, "ServiceID": service.service_id, "ServiceName": service.name,
                "ServiceTags": list(service.tags), "Type": check.kind, "CreateIndex": check.create_index,
                "ModifyIndex": check.modify_index}

    # -- KV ----------------------------------------------------------------------------------------------------------

    def _kv_index(self, key: str, prefix: bool) -> int:
        indexes = [e.modify_index for k, e in self._kv.items() if (k.startswith(key) if prefix else k == key)]
        indexes += [i for k, i in self._kv_tombstones.items() if (k.startswith(key) if prefix else k == key)]
        return max(indexes, default=self._kv_table_index)

    async def _kv_get(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        key = unquote(match["key"])
        listing = _flag(request.query, "recurse") or _flag(request.query, "keys")
        await self._block(request, lambda: self._kv_index(key, listing))
        index = self._kv_index(key, listing)
        if anonymous:
            if listing:
                return _json_response([], index=index, filtered=True)
            raise HTTPError(403, "Permission denied: anonymous token lacks permission 'key:read'")
        if _flag(request.query, "keys"):
            separator = request.query.get("separator", "")
            keys: set[str] = set()
            for k in self._kv:
                if k.startswith(key):
                    cut = k.find(separator, len(key)) if separator else -1
                    keys.add(k[: cut + len(separator)] if cut >= 0 else k)
            if not keys:
                return _Response(status=404, index=index)
            return _json_response(sorted(keys), index=index)
        found = sorted(k for k in self._kv if (k.startswith(key) if listing else k == key))
        if not found:
            return _Response(status=404, index=index)
        if _flag(request.query, "raw") and not listing:
            return _Response(body=self._kv[key].value or b"", content_type="application/octet-stream", index=index)
        return _json_response([self._kv_json(k) for k in found], index=index)

    def _kv_json(self, key: str) -> dict[str, Any]:
        entry = self._kv[key]
        value = base64.b64encode(entry.value).decode() if entry.value else None
        found: dict[str, Any] = {"LockIndex": entry.lock_index, "Key": key, "Flags": entry.flags, "Value": value,
                                 "CreateIndex": entry.create_index, "ModifyIndex": entry.modify_index}
        if entry.session is not None:
            found["Session"] = entry.session
        return found

    async def _kv_put(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        if anonymous:
            raise HTTPError(403, "Permission denied: anonymous token lacks permission 'key:write'")
        key = unquote(match["key"])
        if not key:
            raise HTTPError(400, "Missing key name")
        if len(request.body) > KV_MAX_BYTES:
            raise HTTPError(413, f"Request body({len(request.body)} bytes) too large, max size: {KV_MAX_BYTES} bytes.")
        existing = self._kv.get(key)
        if "acquire" in request.query or "release" in request.query:
            return self._kv_lock(request, key, existing)
        if "cas" in request.query:
            cas = _int_param(request.query, "cas")
            if (cas == 0 and existing is not None) or (cas != 0 and (existing is None or existing.modify_index != cas)):
                return _json_response(False)
        flags = _int_param(request.query, "flags") if "flags" in request.query else 0
        index = self._bump(kv_keys=(key,))
        self._kv[key] = _KvEntry(request.body or None, flags, existing.create_index if existing else index, index,
                                 existing.session if existing else None, existing.lock_index if existing else 0)
        self._kv_tombstones.pop(key, None)
        return _json_response(True)

    def _kv_lock(self, request: _Request, key: str, existing: _KvEntry | None) -> _Response:
        acquire = "acquire" in request.query
        session_id = request.query["acquire" if acquire else "release"]
        if session_id not in self._sessions:
            raise HTTPError(500, f'invalid session "{session_id}"')
        flags = _int_param(request.query, "flags") if "flags" in request.query else 0
        if acquire:
            holder = existing.session if existing is not None else None
            if holder is not None and holder != session_id:
                return _json_response(False)
            if holder is None and time.monotonic() < self._lock_delay_until.get(key, 0.0):
                return _json_response(False)
            index = self._bump(kv_keys=(key,))
            lock_index = (existing.lock_index if existing else 0) + (0 if holder == session_id else 1)
            self._kv[key] = _KvEntry(request.body or None, flags, existing.create_index if existing else index,
                                     index, session_id, lock_index)
            self._kv_tombstones.pop(key, None)
            return _json_response(True)
        if existing is None or existing.session != session_id:
            return _json_response(False)
        index = self._bump(kv_keys=(key,))
        existing.session, existing.modify_index = None, index
        if request.body:
            existing.value = request.body
        return _json_response(True)

    # -- sessions ----------------------------------------------------------------------------------------------------

    def _session_json(self, session: _Session) -> dict[str, Any]:
        return {"ID": session.session_id, "Name": session.name, "Node": self.node, "LockDelay": session.lock_delay_s,
                "Behavior": session.behavior, "TTL": f"{session.ttl_s:g}s" if session.ttl_s else "",
                "CreateIndex": session.create_index, "ModifyIndex": session.create_index}

    def _arm_session(self, session: _Session) -> None:
        if session.timer is not None:
            session.timer.cancel()
        if session.ttl_s:
            session.timer = asyncio.get_running_loop().call_later(
                session.ttl_s, self._invalidate_session, session.session_id)

    def _invalidate_session(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        if session.timer is not None:
            session.timer.cancel()
        held = [k for k, e in self._kv.items() if e.session == session_id]
        if not held:
            return
        index = self._bump(kv_keys=tuple(held))
        for key in held:
            if session.behavior == "delete":
                del self._kv[key]
                self._kv_tombstones[key] = index
            else:
                self._kv[key].session, self._kv[key].modify_index = None, index
            if session.lock_delay_s > 0:
                self._lock_delay_until[key] = time.monotonic() + session.lock_delay_s

    async def _session_create(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        if anonymous:
            raise HTTPError(403, "Permission denied: anonymous token lacks permission 'session:write'")
        body = _json_body(request) if request.body else {}
        if not isinstance(body, dict):
            raise HTTPError(400, "Request decode failed: not an object")
        ttl_s = parse_go_duration(body["TTL"]) if body.get("TTL") else None
        if ttl_s is not None and not self.min_session_ttl_s <= ttl_s <= 86400:
            raise HTTPError(400, f"Invalid Session TTL '{int(ttl_s * 1e9)}', must be between "
                                 f"[{self.min_session_ttl_s:g}s=24h0m0s]")
        behavior = body.get("Behavior") or "release"
        if behavior not in ("release", "delete"):
            raise HTTPError(400, f"Invalid Behavior setting '{behavior}'")
        raw_delay = body.get("LockDelay", "15s")
        lock_delay_s = parse_go_duration(raw_delay) if isinstance(raw_delay, str) else float(raw_delay) / 1e9
        self._session_counter += 1
        session_id = f"00000000-0000-4000-8000-{self._session_counter:012d}"
        session = _Session(session_id, str(body.get("Name", "")), ttl_s, behavior, lock_delay_s, self._bump())
        self._sessions[session_id] = session
        self._arm_session(session)
        return _json_response({"ID": session_id})

    async def _session_renew(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        session = self._sessions.get(unquote(match["id"]))
        if session is None:
            raise HTTPError(404, f"Session id '{unquote(match['id'])}' not found")
        self._arm_session(session)
        return _json_response([self._session_json(session)])

    async def _session_destroy(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        session = self._sessions.get(unquote(match["id"]))
        if session is not None:
            self._invalidate_session(session.session_id)
        return _json_response(True)

    async def _session_info(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        session = self._sessions.get(unquote(match["id"]))
        return _json_response([self._session_json(session)] if session is not None else None, index=self._index)

    async def _kv_delete(self, request: _Request, match: re.Match[str], anonymous: bool) -> _Response:
        if anonymous:
            raise HTTPError(403, "Permission denied: anonymous token lacks permission 'key:write'")
        key = unquote(match["key"])
        if _flag(request.query, "recurse"):
            doomed = [k for k in self._kv if k.startswith(key)]
        else:
            existing = self._kv.get(key)
            if "cas" in request.query:
                cas = _int_param(request.query, "cas")
                if existing is None or existing.modify_index != cas:
                    return _json_response(False)
            doomed = [key] if existing is not None else []
        if doomed:
            index = self._bump(kv_keys=tuple(doomed))
            for k in doomed:
                del self._kv[k]
                self._kv_tombstones[k] = index
        return _json_response(True)


# -- helpers ---------------------------------------------------------------------------------------------------------


def _meta_problem(meta: dict[str, str]) -> str | None:
    """Consul's service Meta validation (messages as Consul words them)."""
    if len(meta) > 64:
        return "Node metadata cannot contain more than 64 key/value pairs"
    for key, value in meta.items():
        prefix = f"Couldn't load metadata pair ('{key}', '{value[:40]}'): "
        if key == "":
            return prefix + "Key cannot be blank"
        if not _META_KEY.match(key):
            return prefix + "Key contains invalid characters"
        if len(key) > 128:
            return prefix + "Key is too long (limit: 128 characters)"
        if key.startswith("consul-"):
            return prefix + "Key prefix 'consul-' is reserved for internal use"
        if len(value.encode()) > 512:
            return prefix + "Value is too long (limit: 512 characters)"
    return None


def _zero() -> int:
    return 0


def _flag(query: dict[str, str], name: str) -> bool:
    """A Consul boolean query parameter: present without a value, or with a true value."""
    if name not in query:
        return False
    return query[name].lower() in ("", "1", "t", "true")


def _int_param(query: dict[str, str], name: str) -> int:
    try:
        return int(query[name])
    except ValueError as exc:
        raise HTTPError(400, f"Invalid {name} value: {query[name]!r}") from exc


def _json_body(request: _Request) -> Any:
    try:
        return json.loads(request.body or b"null")
    except ValueError as exc:
        raise HTTPError(400, f"Request decode failed: {exc}") from exc


def _json_response(value: Any, *, index: int | None = None, filtered: bool = False) -> _Response:
    return _Response(body=json.dumps(value).encode(), index=index, filtered=filtered)


def _encode_response(response: _Response) -> bytes:
    lines = [f"HTTP/1.1 {response.status} {_STATUS_TEXT.get(response.status, 'Status')}",
             f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}"]
    if response.index is not None:
        lines.append(f"X-Consul-Index: {response.index}")
        lines.append("X-Consul-Knownleader: true")
    if response.filtered:
        lines.append("X-Consul-Results-Filtered-By-ACLs: true")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + response.body


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3:
        raise ValueError(f"bad request line {line!r}")
    method, target, _version = parts
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    split = urlsplit(target)
    # The path stays percent-encoded: handlers decode the parts they capture (a KV key may hold '%2F').
    return _Request(method.upper(), split.path, dict(parse_qsl(split.query, keep_blank_values=True)), headers, body)
