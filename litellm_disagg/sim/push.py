"""SGLang's push, the engine's side (``BootstrapPush``, a mixin of ``SimEngine``; the rooms are ``bootstrap.py``).

A decode request with a bootstrap room registers it at the prefill engine found in the directory under the room's
bootstrap address and waits for the KV (``_await_push``); the prefill engine, once the prompt is computed, waits for
that registration, "writes" the KV (the transfer time of the timing model) and resolves the room (``_push``). A
timeout or failure on either side fails the request with ``TransferFailed`` (HTTP 500), as SGLang aborts it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from litellm_disagg.sim.bootstrap import BootstrapRooms
from litellm_disagg.sim.errors import TransferFailed
from litellm_disagg.sim.request import Lease, SimRequest

if TYPE_CHECKING:
    from litellm_disagg.sim.directory import EngineDirectory
    from litellm_disagg.sim.engine import Delta, RequestStream
    from litellm_disagg.sim.scheduler import Scheduler
    from litellm_disagg.sim.settings import SimSettings
    from litellm_disagg.sim.stats import EngineStats
    from litellm_disagg.sim.timing import TimingModel

logger = logging.getLogger(__name__)


class BootstrapPush:
    """The push methods of ``SimEngine``; the attributes below are the engine's."""

    engine_id: str
    settings: SimSettings
    rooms: BootstrapRooms
    timing: TimingModel
    stats: EngineStats
    scheduler: Scheduler
    directory: EngineDirectory
    _streams: dict[str, RequestStream]
    _pulls: dict[str, asyncio.Task[None]]
    _wake: asyncio.Event

    def fail_request(self, request_id: str, why: str) -> bool:
        raise NotImplementedError

    async def _push(self, req: SimRequest, lease: Lease, stream: RequestStream, delta: Delta) -> None:
        """Prefill side: wait for the decode to register the room, write the KV, then answer."""
        room_id = req.push_room
        assert room_id is not None
        cfg = self.settings.engine
        try:
            room = await self.rooms.wait_joined(room_id, cfg.bootstrap_timeout_s)
            if room is None:
                why = f"Request {room_id} timed out after {cfg.bootstrap_timeout_s:.1f}s in KVPoll.Bootstrapping"
                self.rooms.fail(room_id, why)
                self._end_push(req, stream, TransferFailed(why))
                return
            if room.decode_tokens != lease.token_ids:
                why = f"room {room_id}: the decode's prompt differs from the prefill's"
                self.rooms.fail(room_id, why)
                self._end_push(req, stream, TransferFailed(why))
                return
            simulated = self.timing.transfer_time(len(lease.token_ids))
            await asyncio.sleep(self.timing.wall(simulated))
            self.stats.nixl_transfers += 1
            self.stats.nixl_bytes_transferred += self.timing.transfer_bytes(len(lease.token_ids))
            self.rooms.succeed(room_id)
            self._end_push(req, stream, delta)
        except asyncio.CancelledError:
            self.rooms.fail(room_id, f"the prefill engine {self.engine_id} is gone")
            raise
        finally:
            self.scheduler.release_lease(req.request_id)
            self._wake.set()

    def _end_push(self, req: SimRequest, stream: RequestStream, item: Delta | BaseException) -> None:
        if self._streams.get(req.request_id) is stream:
            del self._streams[req.request_id]
            stream._put(item)

    async def _await_push(self, req: SimRequest) -> None:
        """Decode side: register the room at the prefill's bootstrap server and wait for its KV."""
        remote = req.remote
        assert remote is not None and remote.push_room is not None
        room_id = remote.push_room
        source = self.directory.get(remote.engine_id)
        rooms = getattr(source, "rooms", None)
        failure: str | None
        try:
            if not isinstance(rooms, BootstrapRooms):
                failure = f"Could not reach the bootstrap server {remote.engine_id}"
            else:
                room = rooms.join(room_id, tuple(req.prompt_token_ids))
                timeout = self.settings.engine.waiting_timeout_s
                try:
                    async with asyncio.timeout(timeout):
                        failure = await asyncio.shield(room.outcome)
                except TimeoutError:
                    failure = f"Request {room_id} timed out after {timeout:.1f}s in KVPoll.WaitingForInput"
                    rooms.forget(room_id)
                except asyncio.CancelledError:
                    rooms.forget(room_id)  # aborted here: no one waits on this room any more
                    raise
        finally:
            self._pulls.pop(req.request_id, None)
        if failure is None:
            num_tokens = req.num_prompt_tokens - req.num_local_hit_tokens
            self.stats.nixl_xfer_time.observe(self.timing.wall(self.timing.transfer_time(num_tokens)))
            self.scheduler.remote_kv_loaded(req.request_id)
        else:
            self.stats.nixl_failed_transfers += 1
            logger.info("request %s: %s", req.request_id, failure)
            self.fail_request(req.request_id, f"Decode transfer failed for request: {failure}")
        self._wake.set()
