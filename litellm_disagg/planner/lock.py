"""One planner acts when several proxies run: a lock through the registry.

    PlannerLock.acquire() -> bool      try to hold (or keep holding) the lock; never waits for it
    PlannerLock.release()              give it up (a planner that stops, or a proxy that shuts down)

Every planner step starts with ``acquire()``; only a step that gets ``True`` decides and acts, so a planner that lost
the lock stops acting at its next step.

- File backend (``FileLock``): ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<registry dir>/.planner.lock``, held by an
  open file for as long as the planner runs. The kernel drops the lock when the holder's process dies (however it
  dies), so another planner takes over at its next try. Works between processes on one machine (the file backend's
  reach; ``flock`` over NFS is not to be trusted).
- Consul (``ConsulSessionLock``): a session (``PUT /v1/session/create``, ``TTL`` = ``planner.lock.ttl_s``,
  ``Behavior: release``, ``LockDelay: 0s``) and ``PUT /v1/kv/<key>?acquire=<session>``; each later ``acquire()``
  renews the session (``PUT /v1/session/renew``) and acquires again (true while it holds it). A holder that dies
  stops renewing: Consul invalidates the session after its TTL (up to twice the TTL, Consul says) and releases the
  key; another planner's next ``acquire()`` gets it. A renewal that finds the session gone creates a new one.
  ``LockDelay: 0s`` lets the next planner take over at once; the cost is that a holder cut off from Consul may act
  for up to one more step before its own ``acquire()`` fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote

if TYPE_CHECKING:
    from litellm_disagg.discovery.consul.http import ConsulHttp
    from litellm_disagg.planner.settings import PlannerLockSettings
    from litellm_disagg.settings import RegistrySettings

logger = logging.getLogger(__name__)

LOCK_FILE = ".planner.lock"
CONSUL_LOCK_KEY = "litellm-disagg/planner/leader"


class PlannerLock(Protocol):
    async def acquire(self) -> bool: ...

    async def release(self) -> None: ...


def holder_name() -> str:
    """Who holds the lock, for logs and for the Consul key's value."""
    return f"{socket.gethostname()}:{os.getpid()}"


class FileLock:
    """``flock`` on a file in the registry directory (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    async def acquire(self) -> bool:
        if self._fd is not None:
            return True
        return await asyncio.to_thread(self._try)

    def _try(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, holder_name().encode())
        self._fd = fd
        return True

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class ConsulSessionLock:
    """A Consul session lock on ``key`` (see the module docstring)."""

    def __init__(self, http: ConsulHttp, *, key: str = CONSUL_LOCK_KEY, ttl_s: float = 15.0, own_http: bool = False):
        self._http = http
        self.key = key
        self.ttl_s = ttl_s
        self._own_http = own_http
        self._session: str | None = None
        self._held = False

    @property
    def session(self) -> str | None:
        return self._session

    async def acquire(self) -> bool:
        from litellm_disagg.discovery.consul.http import ConsulError

        try:
            if self._session is not None and not await self._renew():
                self._session = None
            if self._session is None:
                self._session = await self._create()
            answer = await self._http.request(
                "PUT", f"/v1/kv/{quote(self.key)}", params={"acquire": self._session},
                content=json.dumps({"holder": holder_name()}).encode(), accept=(200, 500))
        except ConsulError as exc:
            if self._held:
                logger.warning("planner lock: Consul unreachable, no longer acting as the planner: %s", exc)
            self._held = False
            return False
        if answer.status == 500:  # "invalid session": it expired between the renewal and the acquire
            self._session = None
            self._held = False
            return False
        self._held = answer.body is True
        return self._held

    async def _create(self) -> str:
        answer = await self._http.request("PUT", "/v1/session/create", json_body={
            "Name": f"litellm-disagg planner {holder_name()}",
            "TTL": f"{self.ttl_s:g}s",
            "Behavior": "release",
            "LockDelay": "0s",
        })
        session = answer.body.get("ID") if isinstance(answer.body, dict) else None
        if not isinstance(session, str) or not session:
            from litellm_disagg.discovery.consul.http import ConsulError

            raise ConsulError("consul session/create answered without an ID")
        return session

    async def _renew(self) -> bool:
        assert self._session is not None
        answer = await self._http.request("PUT", f"/v1/session/renew/{quote(self._session)}", accept=(200, 404))
        return answer.status == 200

    async def release(self) -> None:
        from litellm_disagg.discovery.consul.http import ConsulError

        session, self._session, self._held = self._session, None, False
        if session is not None:
            with contextlib.suppress(ConsulError):
                await self._http.request("PUT", f"/v1/kv/{quote(self.key)}", params={"release": session},
                                         accept=(200, 500))
                await self._http.request("PUT", f"/v1/session/destroy/{quote(session)}")
        if self._own_http:
            await self._http.aclose()


def make_lock(registry: RegistrySettings, settings: PlannerLockSettings) -> PlannerLock:
    """The lock that goes with the configured registry backend."""
    if registry.backend == "file":
        return FileLock(Path(registry.path) / LOCK_FILE)
    if registry.backend == "consul":
        from litellm_disagg.discovery.consul.endpoint import ConsulEndpoint
        from litellm_disagg.discovery.consul.http import ConsulHttp

        endpoint = ConsulEndpoint.resolve(registry)
        http = ConsulHttp(endpoint, timeout_s=registry.request_timeout_s)
        return ConsulSessionLock(http, ttl_s=settings.ttl_s, own_http=True)
    raise ValueError(f"no planner lock for registry backend {registry.backend!r}")
