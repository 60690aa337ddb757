"""The simulated engine: the scheduler driven in (scaled) real time, KV pulls between engines, event publishing.

Lifecycle: ``start()`` registers the engine in the directory and starts its step loop; ``stop()`` ends it cleanly
(requests still in flight end with ``EngineDead``); ``crash()`` does the same at once, as a dead process would.

The step loop: ``schedule`` -> sleep the step's simulated time / speedup -> ``complete`` -> hand new tokens to the
request streams -> publish the step's KV events. Sleeps aim at deadlines, so the loop's own overhead does not add up
(it may fall behind by at most ``MAX_LAG_S`` when the machine is busy). Idle, it waits for new work or the next
lease expiry.

A decode request with ``remote`` KV is pulled by a task of its own (``_pull``): find the prefill engine in the
directory, check its lease (same prompt tokens), wait the transfer time, check again (it may have crashed or let the
lease expire meanwhile), release the lease; any failure means the decode computes the prompt itself and
``nixl_failed_transfers`` counts it (TensorRT-LLM's generation servers fail the request instead).

SGLang's push (``settings.engine_name == "sglang"``, ``bootstrap.py``): a decode request with a bootstrap room
registers it at the prefill engine (found in the directory by its bootstrap address) and waits (``_await_push``);
the prefill engine, once the prompt is computed, waits for that registration, "writes" the KV (the transfer time)
and resolves the room (``_push``). Either side's timeout or failure fails the request with ``TransferFailed`` (HTTP
500), as SGLang aborts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim.bootstrap import BootstrapRooms
from litellm_disagg.sim.directory import DIRECTORY, EngineDirectory
from litellm_disagg.sim.disagg_input import encode_opaque_state
from litellm_disagg.sim.errors import EngineDead, TransferFailed
from litellm_disagg.sim.kv_cache import BlockPool
from litellm_disagg.sim.kv_events import KVEvent
from litellm_disagg.sim.publisher import KVEventPublisher
from litellm_disagg.sim.push import BootstrapPush
from litellm_disagg.sim.request import FinishReason, Lease, RemotePrefill, SimRequest
from litellm_disagg.sim.request_log import RequestTrace, client_id_of
from litellm_disagg.sim.request_log import write as write_trace
from litellm_disagg.sim.scheduler import RequestOutput, ScheduledStep, Scheduler
from litellm_disagg.sim.settings import SimSettings
from litellm_disagg.sim.stats import EngineStats
from litellm_disagg.sim.textgen import completion, prompt_digest
from litellm_disagg.sim.timing import TimingModel

logger = logging.getLogger(__name__)

MAX_LAG_S = 0.05


@dataclass(frozen=True)
class Delta:
    """New output of one request."""

    token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    kv_transfer_params: dict[str, Any] | None = None


class RequestStream:
    """The output of one request, as the engine produces it. Iterate it; ``abort()`` if the caller goes away."""

    def __init__(self, engine: SimEngine, request: SimRequest):
        self.engine = engine
        self.request = request
        self._queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()

    def _put(self, item: Delta | BaseException) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[Delta]:
        while True:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return

    def abort(self) -> None:
        self.engine.abort(self.request.request_id)


class SimEngine(BootstrapPush):
    def __init__(
        self,
        settings: SimSettings,
        role: WorkerRole,
        *,
        engine_id: str | None = None,
        nixl_host: str = "127.0.0.1",
        nixl_port: int = 1,
        directory: EngineDirectory = DIRECTORY,
        publisher: KVEventPublisher | None = None,
        name: str | None = None,
    ):
        self.settings = settings
        self.name = name or engine_id or "sim"
        """The worker's id, in request traces."""
        self.role = role
        self.engine_id = engine_id or str(uuid.uuid4())
        self.nixl_host = nixl_host
        self.nixl_port = nixl_port
        self.directory = directory
        self.publisher = publisher
        self.timing = TimingModel(settings.timing)
        self.stats = EngineStats()
        self._events: list[KVEvent] = []
        cfg = settings.engine
        self.pool = BlockPool(
            cfg.num_gpu_blocks,
            cfg.block_size,
            enable_prefix_caching=cfg.enable_prefix_caching,
            on_event=self._events.append if publisher is not None else None,
        )
        self.scheduler = Scheduler(
            cfg, self.pool, self.stats, hold_for_remote_decode=role.can_prefill, pull_remote_kv=role.can_decode
        )
        self._streams: dict[str, RequestStream] = {}
        self._pulls: dict[str, asyncio.Task[None]] = {}
        self._pushes: set[asyncio.Task[None]] = set()
        self.rooms = BootstrapRooms()
        self.rids: dict[str, str] = {}
        """SGLang ``rid`` -> internal request id, for ``/abort_request``."""
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._ids = 0
        self.alive = False
        self._traces: dict[str, RequestTrace] = {}
        """Requests in flight, when ``settings.request_log`` is set (``request_log.py``)."""

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._loop_task is not None:
            raise RuntimeError("engine already started")
        self.directory.register(self)
        self.alive = True
        self._loop_task = asyncio.create_task(self._run(), name=f"sim-engine-{self.engine_id}")

    async def stop(self) -> None:
        self._shutdown(EngineDead("engine stopped"))
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for task in list(self._pulls.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.publisher is not None:
            self.publisher.close()

    def crash(self) -> None:
        """Die at once: gone from the directory (held KV lost), every request in flight fails."""
        self._shutdown(EngineDead("engine crashed"))
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self.publisher is not None:
            self.publisher.close()

    def _shutdown(self, why: EngineDead) -> None:
        if not self.alive:
            return
        self.alive = False
        self.directory.unregister(self.engine_id)
        for task in [*self._pulls.values(), *self._pushes]:
            task.cancel()
        self.rooms.fail_all(f"the prefill engine {self.engine_id} is gone")
        for stream in self._streams.values():
            stream._put(why)
        self._streams.clear()

    # -- requests ----------------------------------------------------------------------------------------------------

    def new_request_id(self, base: str) -> str:
        """A unique internal id for a request whose client-visible id is ``base`` (clients may reuse ids)."""
        self._ids += 1
        return f"{base}-{self._ids}"

    def add_request(self, request: SimRequest, *, user: str | None = None) -> RequestStream:
        """``user``: the OpenAI ``user`` field, kept in the request's trace."""
        if not self.alive:
            raise EngineDead("engine is not running")
        if self.settings.request_log is not None:
            self._trace_arrival(request, user)
        self.scheduler.add(request)
        stream = RequestStream(self, request)
        self._streams[request.request_id] = stream
        if request.rid is not None:
            self.rids[request.rid] = request.request_id
        self._wake.set()
        return stream

    def fail_request(self, request_id: str, why: str) -> bool:
        """End a request with ``TransferFailed`` (its KV will not come); False if it is not in flight."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return False
        self.abort(request_id)
        stream._put(TransferFailed(why))
        return True

    def abort_rid(self, rid: str) -> bool:
        """SGLang's ``/abort_request``: a decode still waiting for its KV fails (500); one already running is cut
        short (``finish_reason: abort``). False when no request has that rid."""
        request_id = self.rids.pop(rid, None)
        if request_id is None:
            return False
        req = self.scheduler.get(request_id)
        if req is not None and req.remote is not None and not req.output_token_ids:
            return self.fail_request(request_id, f"Abort request {rid} while waiting for its KV")
        self.abort(request_id)
        return True

    def abort(self, request_id: str) -> None:
        self._traces.pop(request_id, None)
        stream = self._streams.pop(request_id, None)
        req = self.scheduler.abort(request_id)
        if req is not None and req.rid is not None:
            self.rids.pop(req.rid, None)
        pull = self._pulls.pop(request_id, None)
        if pull is not None:
            pull.cancel()
        if req is not None and stream is not None:
            stream._put(Delta([], finished=True, finish_reason="abort"))
        self._wake.set()

    @property
    def idle(self) -> bool:
        """Nothing queued, running or pulling, and no prefill's blocks held for a decode."""
        return self.scheduler.idle and not self.scheduler.leases

    # -- KV source (what decode engines call through the directory) ---------------------------------------------------

    def kv_lease(self, request_id: str) -> Lease | None:
        return self.scheduler.lease(request_id) if self.alive else None

    def release_kv_lease(self, request_id: str) -> None:
        if self.scheduler.release_lease(request_id):
            self._wake.set()

    def transfer_params(self, lease: Lease) -> dict[str, Any] | None:
        """What a finished prefill answers for its decode: vLLM's ``kv_transfer_params``; TensorRT-LLM's
        ``disaggregated_params`` (the server puts them in the choice); nothing for SGLang (the KV is pushed)."""
        name = self.settings.engine_name
        if name == "sglang":
            return None
        if name == "trtllm":
            return {
                "request_type": "context_only",
                "first_gen_tokens": completion(lease.token_ids, 1),
                "ctx_request_id": int.from_bytes(prompt_digest((self._ids,))[:7], "big"),
                "encoded_opaque_state": encode_opaque_state(self.engine_id, lease.request_id, list(lease.block_ids)),
                "draft_tokens": None,
            }
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(lease.block_ids)],
            "remote_engine_id": self.engine_id,
            "remote_request_id": lease.request_id,
            "remote_host": self.nixl_host,
            "remote_port": self.nixl_port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": len(lease.token_ids),
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
        }

    # -- the step loop -----------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._steps()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("engine %s: the step loop failed; the engine is dead", self.engine_id)
            self._shutdown(EngineDead("engine failed"))

    async def _steps(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            now = loop.time()
            if self.scheduler.expire_leases(now):
                self._flush_events()
            step = self.scheduler.schedule()
            for req in step.transfers:
                wait = self._await_push(req) if req.remote and req.remote.push_room is not None else self._pull(req)
                self._pulls[req.request_id] = asyncio.create_task(wait, name=f"sim-kv-{req.request_id}")
            work = step.work
            if work.empty:
                self._flush_events()
                self._wake.clear()
                expiry = self.scheduler.next_lease_expiry()
                timeout = None if expiry is None else max(expiry - loop.time(), 0.0) + 0.001
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                deadline = loop.time()
                continue
            if self._traces:
                self._trace_step(step, loop.time())
            duration = self.timing.step_time(work)
            self.stats.simulated_busy_s += duration
            deadline = max(deadline, loop.time() - MAX_LAG_S) + self.timing.wall(duration)
            await asyncio.sleep(max(deadline - loop.time(), 0.0))
            self._deliver(self.scheduler.complete(step, loop.time()))
            self._flush_events()

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        if self._traces:
            self._trace_outputs(outputs)
        for out in outputs:
            rid = out.request.request_id
            stream = self._streams.get(rid)
            params = self.transfer_params(out.lease) if out.lease is not None else None
            if out.finished:
                self._streams.pop(rid, None)
                if out.request.rid is not None:
                    self.rids.pop(out.request.rid, None)
            if stream is None:
                if out.lease is not None:
                    self.scheduler.release_lease(rid)  # nobody will hand these params to a decode
                    if out.request.push_room is not None:
                        self.rooms.fail(out.request.push_room, f"prefill request {rid} was aborted")
                continue
            reason = out.request.finish_reason if out.finished else None
            delta = Delta(out.new_token_ids, out.finished, reason, params)
            if out.lease is not None and out.request.push_room is not None:
                self._streams[rid] = stream  # still in flight until the push is done
                task = asyncio.create_task(self._push(out.request, out.lease, stream, delta), name=f"sim-push-{rid}")
                self._pushes.add(task)
                task.add_done_callback(self._pushes.discard)
                continue
            stream._put(delta)

    def publish_pending_events(self) -> None:
        """Send the KV events gathered since the last step (the step loop calls this after every step)."""
        self._flush_events()

    def _flush_events(self) -> None:
        if self._events and self.publisher is not None:
            self.publisher.publish(self._events)
        self._events.clear()

    async def _pull(self, req: SimRequest) -> None:
        remote = req.remote
        assert remote is not None
        ok = False
        source = None
        try:
            if remote.vllm_push:
                remote = req.remote = await self._await_vllm_push(req, remote)
            source = self.directory.get(remote.engine_id)
            lease = source.kv_lease(remote.request_id) if source is not None else None
            if source is not None and lease is not None and self._lease_matches(lease, req, remote):
                num_tokens = req.num_prompt_tokens - req.num_local_hit_tokens
                simulated = self.timing.transfer_time(num_tokens)
                trace = self._traces.get(req.request_id)
                if trace is not None:
                    trace.pull_started = asyncio.get_running_loop().time()
                await asyncio.sleep(self.timing.wall(simulated))
                if self.directory.get(remote.engine_id) is source and source.kv_lease(remote.request_id) is lease:
                    ok = True
                    self.stats.nixl_transfers += 1
                    self.stats.nixl_bytes_transferred += self.timing.transfer_bytes(num_tokens)
                    self.stats.nixl_xfer_time.observe(self.timing.wall(simulated))  # seconds as a client sees them
            elif source is not None and lease is not None:
                logger.warning("request %s: remote KV %s does not match its prompt", req.request_id, remote.request_id)
        except asyncio.CancelledError:
            # Aborted here, or this engine died: tell the prefill to free its blocks, as vLLM's decode does.
            if source is not None and self.directory.get(remote.engine_id) is source:
                source.release_kv_lease(remote.request_id)
            raise
        finally:
            self._pulls.pop(req.request_id, None)
        trace = self._traces.get(req.request_id)
        if trace is not None:
            trace.pull_ended = asyncio.get_running_loop().time()
        if source is not None and self.directory.get(remote.engine_id) is source:
            source.release_kv_lease(remote.request_id)
        if ok:
            self.scheduler.remote_kv_loaded(req.request_id)
        elif remote.fail_on_error:
            self.stats.nixl_failed_transfers += 1
            self.fail_request(req.request_id, f"KV transfer from {remote.engine_id} failed")
        else:
            self.stats.nixl_failed_transfers += 1
            logger.info(
                "request %s: KV pull from engine %s failed; recomputing the prompt", req.request_id, remote.engine_id
            )
            self.scheduler.remote_kv_failed(req.request_id)
        self._wake.set()

    async def _await_vllm_push(self, req: SimRequest, remote: RemotePrefill) -> RemotePrefill:
        """vLLM's push connector, decode side: wait until the named prefill engine holds the blocks of the prefill
        with this request's client id (vLLM matches the halves by request id), then take them as a pull would.
        vLLM's decode waits without a limit; here ``bootstrap_timeout_s`` bounds it (then: recompute)."""
        base = _client_id(req.request_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timing.wall(self.settings.engine.bootstrap_timeout_s)
        while loop.time() < deadline:
            source = self.directory.get(remote.engine_id)
            if source is None:
                break  # the handshake with a gone engine fails at once
            found = source.kv_lease_for_client_id(base)
            if found is not None:
                return dataclasses.replace(remote, request_id=found, vllm_push=False)
            await asyncio.sleep(0.001)
        return dataclasses.replace(remote, request_id=f"{base}-unfulfilled", vllm_push=False)

    def kv_lease_for_client_id(self, client_id: str) -> str | None:
        """The internal id of a held lease whose request carries ``client_id`` (push matching)."""
        if not self.alive:
            return None
        for request_id in self.scheduler.leases:
            if _client_id(request_id) == client_id:
                return request_id
        return None

    # -- request traces (request_log.py) -----------------------------------------------------------------------------

    def _trace_arrival(self, req: SimRequest, user: str | None) -> None:
        sched = self.scheduler
        ahead = [*sched.running, *sched.waiting, *sched.ready, *sched.pulling.values()]
        self._traces[req.request_id] = RequestTrace(
            worker_id=self.name,
            role=self.role.value,
            request_id=req.request_id,
            client_id=client_id_of(req.request_id),
            user=user,
            prompt_tokens=req.num_prompt_tokens,
            arrived=asyncio.get_running_loop().time(),
            running_at_arrival=sched.num_running,
            waiting_at_arrival=sched.num_waiting,
            prefill_tokens_ahead=sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in ahead),
        )

    def _trace_step(self, step: ScheduledStep, now: float) -> None:
        """Before the step runs: stamp the requests whose prompt it computes (a chunk, or the last token after a
        pull)."""
        for req, n in step.scheduled:
            trace = self._traces.get(req.request_id)
            if trace is None or req.num_computed_tokens >= req.num_prompt_tokens:
                continue
            if trace.scheduled is None:
                trace.scheduled = now
            trace.prefill_steps += 1
            trace.shared_prefill_tokens += step.prefill_tokens - n if n > 1 else step.prefill_tokens
            trace.shared_decode_seqs += step.decode_seqs - (1 if n == 1 else 0)

    def _trace_outputs(self, outputs: list[RequestOutput]) -> None:
        now = asyncio.get_running_loop().time()
        path = self.settings.request_log
        for out in outputs:
            req = out.request
            trace = self._traces.get(req.request_id)
            if trace is None:
                continue
            if trace.first_token is None:
                trace.first_token = now
            if out.finished:
                del self._traces[req.request_id]
                trace.finished = now
                trace.cached_tokens = req.num_local_hit_tokens
                trace.external_tokens = req.num_external_tokens
                trace.preemptions = req.num_preemptions
                if path is not None:
                    write_trace(path, trace)

    @staticmethod
    def _lease_matches(lease: Lease, req: SimRequest, remote: RemotePrefill) -> bool:
        if lease.token_ids != tuple(req.prompt_token_ids):
            return False
        return remote.block_ids is None or tuple(remote.block_ids) == tuple(lease.block_ids)


def _client_id(request_id: str) -> str:
    """The client-visible id of an internal request id (``new_request_id`` appends ``-<n>``)."""
    return request_id.rsplit("-", 1)[0]
