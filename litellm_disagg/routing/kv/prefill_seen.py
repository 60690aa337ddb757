"""When a decode worker's prefill of a request is over, seen in the worker's own KV events rather than in its stream.

The accounting counts a decode call's prompt tokens as queued for prefill on its worker (local prefill) or as still
to arrive by transfer (remote prefill) until ``prefill_done``, which the controller calls on the call's first
streamed chunk. A non-streamed call has no first chunk: its tokens stayed counted until the whole answer came back,
so for the length of its generation the worker looked as if it still had that prompt to prefill (and the load
scorers and the remote-or-local decision charged a queue that was not there).

A worker that publishes KV events (precise mode) reports each full block it caches. vLLM caches a prompt's blocks as
its prefill computes them (or as their KV arrives from a remote prefill), so once the worker holds the prompt's last
full block, the prefill is over (the step that computes it is the last one, or is running). ``PrefillSeen`` keeps,
per call, that block's hash and worker, and answers which calls' blocks are now held. Only a block the worker did
not hold when the call was sent is a signal: a prompt whose every block was cached there already computes next to
nothing. A prompt shorter than one block, or a worker without events (approximate mode), gives no signal; such a
call's tokens stop counting at its first chunk or its end, as before.

Pure bookkeeping: no I/O, no clock; the caller polls (``KVRouter``) with the index's ``holds``. Entries are bounded
in number (oldest dropped first) and removed when the call ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from litellm_disagg.routing.kv.block_hash import BlockHash

Holds = Callable[[str, BlockHash], bool]
"""``holds(worker_id, block_hash)``: whether the worker's events say it holds the block (predictions excluded)."""


@dataclass(frozen=True, slots=True)
class Awaited:
    """A call whose prefill is over once ``worker_id`` holds ``last_block`` (the prompt's last full block)."""

    worker_id: str
    last_block: BlockHash


class PrefillSeen:
    def __init__(self, *, max_entries: int = 65_536):
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self.max_entries = max_entries
        self._awaited: dict[str, Awaited] = {}
        self.seen = 0
        """Calls whose prefill end was seen in events."""

    def __len__(self) -> int:
        return len(self._awaited)

    def sent(self, call_id: str, worker_id: str, last_block: BlockHash | None, holds: Holds) -> bool:
        """``call_id`` went to ``worker_id`` now (a retry replaces its earlier attempt). Watched only when there is a
        last full block and the worker does not hold it yet; returns whether it is watched."""
        self._awaited.pop(call_id, None)
        if last_block is None or holds(worker_id, last_block):
            return False
        while len(self._awaited) >= self.max_entries:
            del self._awaited[next(iter(self._awaited))]  # oldest first (insertion order)
        self._awaited[call_id] = Awaited(worker_id, last_block)
        return True

    def ended(self, call_id: str) -> None:
        """The call ended (or its first chunk came): nothing more to watch."""
        self._awaited.pop(call_id, None)

    def done(self, holds: Holds) -> list[str]:
        """The watched calls whose worker now holds their last block, no longer watched; oldest first."""
        if not self._awaited:
            return []
        out = [call_id for call_id, a in self._awaited.items() if holds(a.worker_id, a.last_block)]
        for call_id in out:
            del self._awaited[call_id]
        self.seen += len(out)
        return out

    def forget(self, worker_id: str) -> None:
        """The worker left the pool (or its index entries were reset): its calls are not watched any more."""
        for call_id in [c for c, a in self._awaited.items() if a.worker_id == worker_id]:
            del self._awaited[call_id]
