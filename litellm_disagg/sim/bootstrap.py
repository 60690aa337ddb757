"""SGLang's bootstrap rooms, simulated: where a decode engine waits for the KV its prefill engine pushes.

In SGLang (``python/sglang/srt/disaggregation/``: ``prefill.py``, ``decode.py``, ``nixl/conn.py``,
``common/conn.py``) both requests of a pair carry the same ``bootstrap_room``. The decode worker dials the prefill
worker's bootstrap server, registers the room with the blocks it allocated, and polls; the prefill worker, once the
prompt is computed, waits for that registration (``KVPoll.Bootstrapping``), writes the KV into the decode's blocks and
marks the room done (``KVPoll.Success``). Failures:

- the decode side times out after ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` when nothing arrives ("timed out after
  ...s in KVPoll.WaitingForInput"), and fails at once when the prefill reports a failure or stops answering its
  heartbeat (dead prefill worker);
- the prefill side times out after ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` when no decode registers.

``BootstrapRooms`` is one prefill engine's side of that: ``join`` (a decode registers and gets the room's outcome),
``wait_joined`` (the prefill waits for the decode), ``succeed``/``fail`` (the outcome), ``fail_all`` (the engine
died). Rooms are keyed by the room number, as SGLang keys them per bootstrap server. Wall-clock timeouts are the
callers'.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Room:
    room: int
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: asyncio.Future[str | None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """None: the KV arrived; a string: why it will not."""
    decode_tokens: tuple[int, ...] | None = None

    def resolve(self, failure: str | None) -> None:
        if not self.outcome.done():
            self.outcome.set_result(failure)


class BootstrapRooms:
    def __init__(self) -> None:
        self._rooms: dict[int, Room] = {}

    def _get(self, room: int) -> Room:
        found = self._rooms.get(room)
        if found is None:
            found = self._rooms[room] = Room(room)
        return found

    def join(self, room: int, prompt_tokens: tuple[int, ...]) -> Room:
        """A decode registers ``room`` (its prompt's tokens stand for the blocks it allocated)."""
        found = self._get(room)
        found.decode_tokens = prompt_tokens
        found.joined.set()
        return found

    async def wait_joined(self, room: int, timeout_s: float) -> Room | None:
        """The prefill side: the room once a decode registered it, or None after ``timeout_s``."""
        found = self._get(room)
        try:
            async with asyncio.timeout(timeout_s):
                await found.joined.wait()
        except TimeoutError:
            return None
        return found

    def succeed(self, room: int) -> None:
        found = self._rooms.pop(room, None)
        if found is not None:
            found.resolve(None)

    def fail(self, room: int, why: str) -> None:
        found = self._rooms.pop(room, None)
        if found is not None:
            found.resolve(why)

    def forget(self, room: int) -> None:
        """The decode gave up on ``room`` (timeout or abort): nothing will wait on it."""
        found = self._rooms.get(room)
        if found is not None and (found.outcome.done() or found.joined.is_set()):
            self._rooms.pop(room, None)

    def fail_all(self, why: str) -> None:
        rooms, self._rooms = self._rooms, {}
        for found in rooms.values():
            found.resolve(why)

    def __len__(self) -> int:
        return len(self._rooms)
