"""Prefill KV that no decode will read is released at once, not when the engine's lease runs out.

A sequential (pull) prefill leaves its prompt's blocks pinned on the prefill worker until a decode worker has read
them and says so, or until the engine stops waiting. vLLM 0.32's NixlConnector: the decode worker's NIXL
notification after its read frees them; without one, a lease (``kv_lease_duration``, 30 s by default, renewed by
the decode worker's heartbeats while the request waits in its queue) expires. When the decode never reads them
(LiteLLM's call to the decode worker failed: the worker is dead, refused it, or a check failed before it was sent;
or the call was retried elsewhere with a fresh prefill), those blocks are capacity the next prompts wait for, for the
whole lease.

``KVReleases`` keeps, per LiteLLM call, one entry per routing attempt (``attempt``): the transfer it prefilled, if
any, and the decode worker. What ends an entry:

- ``started`` (the first streamed chunk) or a success event: the decode produced a token, so its worker has read the
  KV (vLLM reads the whole prompt's blocks before it computes one); nothing to release;
- a failure event (``ended(failed=True)``): the attempt produced nothing; its transfer is released;
- a newer attempt of the same call: LiteLLM retries only after an attempt raised, so the older one is over and its
  transfer is released at once (its failure event may arrive later, from a background task: it then finds the
  entry already released).

Events carry no attempt number, only the call id and the decode worker: a call's attempts run one after another and
each ends with exactly one event, so an event ends the oldest open entry of that call on that worker.

How a transfer is released is the engine's (``ReleasesUnreadKV``): vLLM's prefill worker frees blocks only when a
decode worker tells it to, and a decode worker does so for a request that carries ``kv_transfer_params`` but is
refused before its engine runs it (vLLM's serving layer then submits it pre-aborted, and the connector notifies the
prefill worker with no blocks read). The release is such a request, sent to a live decode worker of the same model:
the original one when it is still in the pool and not cooling down, else another. It is best effort: with no decode
worker reachable the engine's lease frees the blocks (``litellm-disagg worker --kv-lease-s`` sets it; vLLM's default is 30 s).

vLLM's decode worker sends the "nothing read" notification from its worker process on an engine step, and only once
it is connected to the prefill worker (a first release makes the connection). The pre-aborted request gives an idle
engine one step, which comes too early on a pair not yet connected, and an idle engine takes no other: the blocks
then waited for the decode worker's next request or the lease (measured: never within 300 s on a fresh pair, up to
56 s on a connected one). So after an accepted release the router asks the same decode worker for a few one-token
requests (``StepsAfterRelease.engine_step``, at ``step_delays_s``): each is one engine step.

A release is sent only for an attempt whose decode produced nothing and whose call LiteLLM has given up on or
retried: a decode worker that still runs that request would be reading blocks the prefill worker now reuses. LiteLLM
closes its connection to the decode worker when a call fails or is cancelled, and vLLM aborts a request whose client
went away, so that worker's copy is discarded either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from litellm_disagg.engines import transfer_for
from litellm_disagg.engines.base import TransferHandle
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.runtime_config import RuntimeConfig

logger = logging.getLogger(__name__)


@runtime_checkable
class ReleasesUnreadKV(Protocol):
    """A transfer protocol whose prefill KV a decode worker can be asked to release without reading it."""

    def release_unread(self, handle: TransferHandle) -> tuple[str, dict[str, Any]] | None:
        """The request (path under the server root, JSON body) a decode worker turns into "free these blocks"."""
        ...


@runtime_checkable
class StepsAfterRelease(Protocol):
    """A transfer protocol whose release goes out only on a later step of the decode worker's engine (vLLM)."""

    def engine_step(self, served_model: str) -> tuple[str, dict[str, Any]]:
        """A cheap request (path, JSON body) that makes a decode worker's engine step once."""
        ...


class ControlSender(Protocol):
    async def post_control(self, worker: RuntimeConfig, path: str, body: dict[str, Any]) -> int | None: ...


@dataclass
class Attempt:
    decode_worker_id: str
    prefill: RuntimeConfig | None = None
    handle: TransferHandle | None = None
    started: bool = False
    released: bool = False
    at: float = field(default_factory=time.monotonic)

    @property
    def unread(self) -> bool:
        return self.handle is not None and not self.started and not self.released


class KVReleases:
    def __init__(
        self,
        *,
        sender: ControlSender,
        pool: Callable[[], WorkerPool],
        cooldown: FailureCooldown,
        max_age_s: float = 600.0,
        max_targets: int = 2,
        step_delays_s: tuple[float, ...] = (0.5, 2.0, 5.0),
    ):
        self._sender = sender
        self._pool = pool
        self._cooldown = cooldown
        self.max_age_s = max_age_s
        """Entries older than this are forgotten (bookkeeping only: the engine's lease has long run out by then)."""
        self.max_targets = max_targets
        """How many decode workers a release tries before leaving the blocks to the engine's lease."""
        self.step_delays_s = step_delays_s
        """After a release, when (seconds after it was accepted) to make its decode worker's engine step
        (``StepsAfterRelease``): the notification that frees the blocks goes out on a step taken once the worker is
        connected to the prefill worker, and an idle engine takes none by itself. Empty: no steps."""
        self._calls: dict[str, list[Attempt]] = {}
        self.max_pairs = 4096
        self._connected: dict[tuple[str, str], None] = {}
        """(prefill, decode) worker pairs a decode has read KV through, oldest first (bounded): a release goes
        through a decode worker already connected to the prefill worker when there is one. A first contact makes
        the decode worker handshake with the prefill worker, which vLLM gives 5 s; on a loaded CPU machine it timed
        out and the blocks stayed for the whole lease."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        """Releases a decode worker accepted (answered at all)."""
        self.steps = 0
        """Engine steps asked of decode workers after releases (answered at all)."""

    # -- events ---------------------------------------------------------------------------------------------------

    def attempt(
        self, call_id: str, *, decode: RuntimeConfig, prefill: RuntimeConfig | None, handle: TransferHandle | None
    ) -> None:
        """A routing attempt of ``call_id`` chose ``decode`` and (when disaggregated) prefilled ``handle`` on
        ``prefill``. Earlier attempts of the call are over: their unread transfers are released now."""
        self._expire()
        attempts = self._calls.setdefault(call_id, [])
        for earlier in attempts:
            self._release(earlier)
        attempts.append(Attempt(decode.worker_id, prefill, handle))

    def started(self, call_id: str) -> None:
        """The call's decode streamed its first chunk: the latest attempt's KV has been read."""
        attempts = self._calls.get(call_id)
        if attempts:
            attempts[-1].started = True
            self._read_through(attempts[-1])

    def _read_through(self, attempt: Attempt) -> None:
        """``attempt``'s decode worker read KV from its prefill worker: that pair is connected."""
        if attempt.prefill is None or attempt.handle is None:
            return
        pair = (attempt.prefill.worker_id, attempt.decode_worker_id)
        self._connected.pop(pair, None)
        self._connected[pair] = None
        while len(self._connected) > self.max_pairs:
            self._connected.pop(next(iter(self._connected)))

    def ended(self, call_id: str, *, worker_id: str | None, failed: bool) -> None:
        """LiteLLM's success or failure event for one attempt of ``call_id`` on ``worker_id`` (None: unknown)."""
        attempts = self._calls.get(call_id)
        if not attempts:
            return
        index = next((i for i, a in enumerate(attempts) if worker_id is None or a.decode_worker_id == worker_id), None)
        if index is None:
            return
        attempt = attempts.pop(index)
        if not attempts:
            del self._calls[call_id]
        if failed:
            self._release(attempt)
        else:
            attempt.started = True
            self._read_through(attempt)

    def open(self) -> int:
        """Attempts not yet ended (for tests and metrics)."""
        return sum(len(a) for a in self._calls.values())

    # -- releasing ------------------------------------------------------------------------------------------------

    def _release(self, attempt: Attempt) -> None:
        if not attempt.unread or attempt.prefill is None or attempt.handle is None:
            return
        attempt.released = True
        protocol = transfer_for(attempt.prefill)  # a vLLM push worker's is the push protocol (no release)
        if not isinstance(protocol, ReleasesUnreadKV):
            return
        request = protocol.release_unread(attempt.handle)
        if request is None:
            return
        targets = self._targets(attempt)
        if not targets:
            logger.info("no decode worker to release KV on %s: the engine's lease frees it", attempt.prefill.worker_id)
            return
        step = protocol.engine_step if isinstance(protocol, StepsAfterRelease) else None
        task = asyncio.get_running_loop().create_task(self._send(targets, request, step), name="litellm-disagg-kv-release")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _targets(self, attempt: Attempt) -> list[RuntimeConfig]:
        """Live decode workers of the prefill worker's model and engine: healthy ones first, then those already
        connected to the prefill worker, then the attempt's own."""
        assert attempt.prefill is not None
        prefill = attempt.prefill
        pool = self._pool()
        candidates = [
            w for w in pool.decode_candidates(prefill.model)
            if w.worker_id != prefill.worker_id and w.engine == prefill.engine
        ]  # fmt: skip
        candidates.sort(key=lambda w: ((prefill.worker_id, w.worker_id) not in self._connected,
                                       w.worker_id != attempt.decode_worker_id))
        return self._cooldown.prefer_healthy(candidates)[: self.max_targets]

    async def _send(
        self,
        targets: list[RuntimeConfig],
        request: tuple[str, dict[str, Any]],
        step: Callable[[str], tuple[str, dict[str, Any]]] | None,
    ) -> None:
        for target in targets:
            status = await self._sender.post_control(target, *request)
            if status is not None:
                self.sent += 1
                logger.debug("released unread KV through %s (%s)", target.worker_id, status)
                if step is not None:
                    await self._step(target, step(target.model))
                return

    async def _step(self, target: RuntimeConfig, request: tuple[str, dict[str, Any]]) -> None:
        waited = 0.0
        for at in self.step_delays_s:
            await asyncio.sleep(max(0.0, at - waited))
            waited = max(waited, at)
            if await self._sender.post_control(target, *request) is None:
                return  # the worker went away: its engine steps no more
            self.steps += 1

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.max_age_s
        stale = [cid for cid, attempts in self._calls.items() if attempts[-1].at < cutoff]
        for cid in stale:
            del self._calls[cid]

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
