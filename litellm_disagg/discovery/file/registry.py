"""The embedded registry: one JSON file per worker in a local directory. No server needed.

Each file holds ``{"heartbeat_at": <unix time>, "config": <RuntimeConfig>}`` and is replaced atomically (write to a
temporary file in the same directory, then rename), so a reader never sees half a file. Entries whose heartbeat is
older than ``ttl_s`` are ignored (and swept by the next writer). Readers poll; ``watch`` notices a change within
``poll_interval_s``. All file I/O runs in a thread so the event loop never blocks on the disk.

Entries are claims, not facts: anyone who can write the directory can write one. A reader skips (and logs once) what
is not a plain file (a symlink, a FIFO, a device), a file larger than ``MAX_ENTRY_BYTES``, a heartbeat that is not a
finite number or lies in the future (beyond ``ttl_s`` of clock skew), and invalid configs; and it warns once when the
directory is writable by its group or by everyone. Role requests live next to the entries as ``<worker_id>.role.json``
(``request_role`` and ``request_drain`` write one, ``role_requests`` polls it, ``withdraw`` deletes it) and are read with the same care. An unchanged file (same size, modification time and inode) is not
parsed again, so a directory of thousands of entries costs one ``stat`` each per poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import stat as stat_mod
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.discovery.registry import RegistryError
from litellm_disagg.discovery.roles import (
    MAX_REQUEST_BYTES,
    AfterDrain,
    RoleRequest,
    check_request,
    decode_request,
    drain_request,
)
from litellm_disagg.discovery.status import DiscoveryStatus
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole

logger = logging.getLogger(__name__)

T = TypeVar("T")

_SUFFIX = ".worker.json"
_ROLE_SUFFIX = ".role.json"
"""A worker's role request (``discovery/roles.py``), next to its entry."""
MAX_ENTRY_BYTES = 64 * 1024
"""A RuntimeConfig is well under 2 KiB; anything this large is not one."""


class FileRegistry:
    """A ``Registry`` backed by a directory shared by the workers and routers of one machine."""

    def __init__(self, directory: str | os.PathLike[str], *, ttl_s: float = 10.0, poll_interval_s: float = 0.25):
        if ttl_s <= 0 or poll_interval_s <= 0:
            raise ValueError("ttl_s and poll_interval_s must be positive")
        self.directory = Path(directory)
        self.ttl_s = ttl_s
        self.poll_interval_s = poll_interval_s
        self._published: dict[str, RuntimeConfig] = {}
        self._closed = asyncio.Event()
        self._status = DiscoveryStatus("file registry")
        self._warned: set[tuple[str, float]] = set()
        self._parsed: dict[str, tuple[tuple[int, int, int], float, RuntimeConfig]] = {}
        """File name -> ((size, mtime_ns, inode), heartbeat_at, config) of its last valid parse."""
        self._warned_dir = False
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_settings(cls, settings: FileRegistrySettings) -> FileRegistry:
        return cls(settings.path, ttl_s=settings.ttl_s, poll_interval_s=settings.poll_interval_s)

    # -- writer side -------------------------------------------------------------------------------------------------

    async def publish(self, config: RuntimeConfig) -> None:
        self._published[config.worker_id] = config
        await self._in_thread(self._write, config)

    async def heartbeat(self, worker_id: str) -> None:
        config = self._published.get(worker_id)
        if config is None:
            raise RegistryError(f"heartbeat for {worker_id!r}, which this registry did not publish")
        await self._in_thread(self._write, config)

    async def withdraw(self, worker_id: str) -> None:
        self._published.pop(worker_id, None)
        await self._in_thread(functools.partial(self._path(worker_id).unlink, missing_ok=True))
        await self._in_thread(functools.partial(self._role_path(worker_id).unlink, missing_ok=True))

    def _path(self, worker_id: str) -> Path:
        return self.directory / f"{worker_id}{_SUFFIX}"

    def _role_path(self, worker_id: str) -> Path:
        return self.directory / f"{worker_id}{_ROLE_SUFFIX}"

    # -- role requests (discovery/roles.py) --------------------------------------------------------------------------

    async def request_role(self, worker_id: str, role: WorkerRole) -> None:
        check_request(await self.snapshot(), worker_id, role)
        request = RoleRequest(worker_id=worker_id, role=role)
        await self._in_thread(self._write_atomic, self._role_path(worker_id), request.encode())

    async def request_drain(self, worker_id: str, *, then: AfterDrain = AfterDrain.EXIT) -> None:
        request = drain_request(await self.snapshot(), worker_id, then)
        await self._in_thread(self._write_atomic, self._role_path(worker_id), request.encode())

    async def role_requests(self, worker_id: str) -> AsyncIterator[RoleRequest | None]:
        """The worker's request at once, then after every change (polled every ``poll_interval_s``)."""
        path = self._role_path(worker_id)
        first, last = True, None
        while not self._closed.is_set():
            current = await self._in_thread(self._read_role, path, worker_id)
            if first or current != last:
                first, last = False, current
                yield current
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval_s):
                    await self._closed.wait()

    def _read_role(self, path: Path, worker_id: str) -> RoleRequest | None:
        try:
            info = os.lstat(path)
            if not stat_mod.S_ISREG(info.st_mode):
                self._warn_once(path, "not a regular file (symlink, FIFO, device...): skipped", info.st_mtime)
                return None
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_REQUEST_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn_once(path, f"unreadable: {exc}")
            return None
        try:
            return decode_request(raw, worker_id)
        except ValueError as exc:
            self._warn_once(path, f"invalid role request skipped: {_one_line(exc)}", info.st_mtime)
            return None

    def _write_atomic(self, path: Path, data: bytes) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise RegistryError(f"cannot write to registry directory {self.directory}: {exc}") from exc

    def _write(self, config: RuntimeConfig) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            record = {"heartbeat_at": time.time(), "config": config.model_dump(mode="json")}
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(record, f)
                os.replace(tmp, self._path(config.worker_id))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise RegistryError(f"cannot write to registry directory {self.directory}: {exc}") from exc

    # -- reader side -------------------------------------------------------------------------------------------------

    async def snapshot(self) -> list[RuntimeConfig]:
        return await self._in_thread(self._read_all)

    def _read_all(self) -> list[RuntimeConfig]:
        try:
            paths = sorted(self.directory.glob(f"*{_SUFFIX}"))
        except OSError as exc:
            raise RegistryError(f"cannot list registry directory {self.directory}: {exc}") from exc
        self._check_directory()
        now = time.time()
        live: dict[str, RuntimeConfig] = {}
        seen: set[str] = set()
        for path in paths:
            seen.add(path.name)
            config = self._read_one(path, now)
            if config is None:
                continue
            if config.worker_id in live:
                self._warn_once(path, f"duplicate worker_id {config.worker_id!r}: skipped")
                continue
            live[config.worker_id] = config
        for gone in set(self._parsed) - seen:
            del self._parsed[gone]
        return list(live.values())

    def _check_directory(self) -> None:
        if self._warned_dir:
            return
        try:
            mode = self.directory.stat().st_mode
        except OSError:
            return
        if mode & (stat_mod.S_IWGRP | stat_mod.S_IWOTH):
            self._warned_dir = True
            logger.warning(
                "registry %s is writable by its group or by everyone: anyone who can write it can announce workers",
                self.directory,
            )

    def _read_one(self, path: Path, now: float) -> RuntimeConfig | None:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None  # withdrawn between listing and reading
        except OSError as exc:
            self._warn_once(path, f"unreadable: {exc}", stat_mtime=0.0)
            return None
        if not stat_mod.S_ISREG(info.st_mode):
            self._warn_once(path, "not a regular file (symlink, FIFO, device...): skipped", info.st_mtime)
            return None
        if info.st_size > MAX_ENTRY_BYTES:
            self._warn_once(path, f"{info.st_size} bytes, more than {MAX_ENTRY_BYTES}: skipped", info.st_mtime)
            return None
        key = (info.st_size, info.st_mtime_ns, info.st_ino)
        cached = self._parsed.get(path.name)
        if cached is not None and cached[0] == key:
            heartbeat_at, config = cached[1], cached[2]
        else:
            parsed = self._parse(path, info)
            if parsed is None:
                self._parsed.pop(path.name, None)
                return None
            heartbeat_at, config = parsed
            self._parsed[path.name] = (key, heartbeat_at, config)
        if heartbeat_at > now + self.ttl_s:
            self._warn_once(path, "heartbeat in the future: skipped", info.st_mtime)
            return None
        if now - heartbeat_at > self.ttl_s:
            # Once per version of the file: a crashed worker's entry, or a live one whose heartbeats stalled.
            self._warn_once(
                path, f"heartbeat {now - heartbeat_at:.1f} s old, over the {self.ttl_s:g} s TTL: left out",
                info.st_mtime,
            )
            return None
        return config

    def _parse(self, path: Path, info: os.stat_result) -> tuple[float, RuntimeConfig] | None:
        try:
            # O_NOFOLLOW and O_NONBLOCK: a symlink or FIFO swapped in after the lstat can neither redirect nor block us.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_ENTRY_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._warn_once(path, f"unreadable: {exc}", stat_mtime=info.st_mtime)
            return None
        try:
            if len(raw) > MAX_ENTRY_BYTES:
                raise ValueError(f"more than {MAX_ENTRY_BYTES} bytes")
            record: Any = json.loads(raw)
            heartbeat_at = record["heartbeat_at"]
            if not isinstance(heartbeat_at, (int, float)) or isinstance(heartbeat_at, bool):
                raise TypeError("heartbeat_at is not a number")
            if not math.isfinite(heartbeat_at):
                raise ValueError("heartbeat_at is not finite")
            config = RuntimeConfig.model_validate(record["config"])
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            self._warn_once(path, f"invalid entry skipped: {_one_line(exc)}", stat_mtime=info.st_mtime)
            return None
        expected = path.name[: -len(_SUFFIX)]
        if config.worker_id != expected:
            self._warn_once(path, f"worker_id {config.worker_id!r} does not match file name: skipped", info.st_mtime)
            return None
        return float(heartbeat_at), config

    def _warn_once(self, path: Path, message: str, stat_mtime: float = 0.0) -> None:
        key = (path.name, stat_mtime)
        if key not in self._warned:
            if len(self._warned) >= 4096:  # a broken entry rewritten forever must not grow this without bound
                self._warned.clear()
            self._warned.add(key)
            logger.warning("registry %s: %s: %s", self.directory, path.name, message)

    async def watch(self) -> AsyncIterator[list[RuntimeConfig]]:
        last: list[RuntimeConfig] | None = None
        while not self._closed.is_set():
            try:
                current = await self.snapshot()
            except RegistryError as exc:
                self._status.failed(exc)
                raise
            self._status.ok()
            if current != last:
                last = current
                yield current
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval_s):
                    await self._closed.wait()

    async def close(self) -> None:
        self._closed.set()

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Disk I/O on this registry's own threads: the loop's default executor is shared with everything else in
        the process (LiteLLM's logging callbacks under load), and a heartbeat queued behind them for longer than the
        TTL makes a healthy worker vanish from discovery."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="file-registry")
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
