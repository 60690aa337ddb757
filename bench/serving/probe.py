"""A timing probe loaded into the benchmark's proxy (``--probe-proxy``): where a request's ``proxy_in`` goes, and how
late the proxy's event loop runs. Bench only: the arm configs list it as a LiteLLM callback
(``bench.serving.probe.handler``) when the flag is given; ``BENCH_PROXY_PROBE`` names its output file.

Per request (named by the ``user`` the load generator sends), on the machine's monotonic clock:

    asgi        the proxy's ASGI app was called for it (uvicorn parsed the request)
    pre_hook    LiteLLM's pre-call hooks ran (after auth and body parsing)
    route_start / route_end   litellm-disagg's deployment selection (KV arm only); route_cpu: the event loop
                              thread's CPU seconds in between (``time.thread_time``)
    pre_api     LiteLLM is about to send it to the worker

and, every 2 ms, how late a ``sleep`` woke up (the event loop's lag): samples over 1 ms are written with their time
and, from the loop thread's ``schedstat``, how much of that span the thread spent on a core (running callbacks) and
runnable in the run queue (waiting for the OS to give it a core); the rest it was blocked (the GIL, a blocking call).
Once a second it also writes the process's threads (native id -> name), for per-thread CPU from ``/proc``, and the
KV event messages received so far; every garbage collection is written with its length.

Experiments, through the environment: ``BENCH_SWITCH_INTERVAL`` (``sys.setswitchinterval`` in the proxy),
``BENCH_PREFILL_POLL_S`` (the KV router's prefill watch period, ``routing/kv/router.py`` ``PREFILL_POLL_S``) and
``BENCH_PROFILE_ROUTE`` (a file: cProfile of the selections, written every 20 of them; the KV arm only).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import sys
import threading
import time
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

_ENV = "BENCH_PROXY_PROBE"
_asgi_at: contextvars.ContextVar[float | None] = contextvars.ContextVar("bench_probe_asgi", default=None)
_record: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("bench_probe_record", default=None)


def _user_of(data: dict[str, Any]) -> str | None:
    for source in (data, data.get("extra_body") or {}, data.get("metadata") or {}):
        if isinstance(source, dict) and isinstance(source.get("user"), str):
            return source["user"]
    return None


class Probe(CustomLogger):
    def __init__(self) -> None:
        super().__init__()
        self.path = os.environ.get(_ENV)
        self.pending: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._wrapped_app = False
        if not self.path or "litellm.proxy.proxy_server" not in sys.modules:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self._lag_loop(), name="bench-probe-lag")
        self._wrap_strategy()
        # Experiments: the GIL's switch interval, and the KV router's prefill watch period.
        if os.environ.get("BENCH_SWITCH_INTERVAL"):
            sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))
        if os.environ.get("BENCH_PREFILL_POLL_S"):
            from litellm_disagg.routing.kv import router

            router.PREFILL_POLL_S = float(os.environ["BENCH_PREFILL_POLL_S"])
        self._count_events()
        self._time_gc()

    def _time_gc(self) -> None:
        """Every garbage collection: its generation, its length and when it ended."""
        import gc

        started: list[float] = [0.0]

        def callback(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                self.pending.append(json.dumps({"gc": info.get("generation"), "ms": (time.perf_counter() - started[0]) * 1e3,
                                                "t": time.monotonic()}))

        gc.callbacks.append(callback)

    def _count_events(self) -> None:
        """Keeps the KV event subscribers: their ``messages`` counts go out once a second."""
        import weakref

        from litellm_disagg.routing.kv import event_subscriber as es

        self.subscribers: weakref.WeakSet[Any] = weakref.WeakSet()
        original_init = es.KVEventSubscriber.__init__
        subscribers = self.subscribers

        def init(sub: Any, *args: Any, **kwargs: Any) -> None:
            original_init(sub, *args, **kwargs)
            subscribers.add(sub)

        es.KVEventSubscriber.__init__ = init  # type: ignore[method-assign]

    # -- loop lag --------------------------------------------------------------------------------------------------

    async def _lag_loop(self) -> None:
        period = 0.002
        last_flush = time.monotonic()
        stat = _SchedStat.of_this_thread()
        while True:
            before = time.monotonic()
            was = stat.read()
            await asyncio.sleep(period)
            now = time.monotonic()
            lag = now - before - period
            if lag > 0.001:
                item: dict[str, float] = {"lag": lag, "t": now, "span": now - before}
                if was is not None and (is_ := stat.read()) is not None:
                    # Where the loop thread's time went while it should have been waking: on a core (running
                    # callbacks), in the run queue (runnable, no core given: the OS), or neither (blocked: the GIL,
                    # a blocking call, or the wait itself).
                    item["on_cpu"] = (is_[0] - was[0]) / 1e9
                    item["runqueue"] = (is_[1] - was[1]) / 1e9
                self.pending.append(json.dumps(item))
            if not self._wrapped_app:
                self._wrap_app()
            if now - last_flush > 1.0:
                last_flush = now
                threads = {t.native_id: t.name for t in threading.enumerate()}
                self.pending.append(json.dumps({"threads": threads, "t": now}))
                subs = list(getattr(self, "subscribers", ()))
                if subs:
                    self.pending.append(json.dumps({"events": sum(x.messages for x in subs), "t": now}))
                self._flush()

    def _flush(self) -> None:
        if not self.pending or not self.path:
            return
        lines, self.pending = self.pending, []
        with open(self.path, "a") as f:
            f.write("\n".join(lines) + "\n")

    # -- request timings -------------------------------------------------------------------------------------------

    def _wrap_app(self) -> None:
        from litellm.proxy import proxy_server

        app = getattr(proxy_server, "app", None)
        if app is None:
            return
        original = app.build_middleware_stack

        def build() -> Any:
            inner = original()

            async def timed(scope: Any, receive: Any, send: Any) -> None:
                _asgi_at.set(time.monotonic())
                await inner(scope, receive, send)

            return timed

        app.build_middleware_stack = build
        app.middleware_stack = None  # rebuilt on the next request, with the timing wrapper outside
        self._wrapped_app = True

    def _wrap_strategy(self) -> None:
        from litellm_disagg.routing.strategy import DisaggRoutingStrategy

        original = DisaggRoutingStrategy.async_get_available_deployment
        if getattr(original, "_bench_probe", False):
            return

        profile_to = os.environ.get("BENCH_PROFILE_ROUTE")
        profiler = None
        if profile_to:  # experiment: cProfile the selections (and whatever runs while one awaits) into this file
            import cProfile

            profiler = cProfile.Profile()
        calls = [0]

        async def timed(strategy: Any, *args: Any, **kwargs: Any) -> Any:
            record = _record.get()
            if record is not None:
                record["route_start"] = time.monotonic()
                cpu = time.thread_time()
            if profiler is not None:
                profiler.enable()
            try:
                return await original(strategy, *args, **kwargs)
            finally:
                if profiler is not None:
                    profiler.disable()
                    calls[0] += 1
                    if calls[0] % 20 == 0:  # the proxy is killed, not shut down: write as it goes
                        profiler.dump_stats(profile_to)
                if record is not None:
                    record["route_end"] = time.monotonic()
                    # The event loop thread's CPU meanwhile: the selection's own, plus any other task's that ran
                    # while it awaited (a later turn's selection awaits nothing that suspends); the rest of
                    # ``route`` is waiting for a core or the GIL.
                    record["route_cpu"] = time.thread_time() - cpu

        timed._bench_probe = True  # type: ignore[attr-defined]
        DisaggRoutingStrategy.async_get_available_deployment = timed  # type: ignore[method-assign]

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any],
                                  call_type: Any) -> dict[str, Any]:
        user = _user_of(data)
        if user is not None:
            _record.set({"user": user, "asgi": _asgi_at.get(), "pre_hook": time.monotonic()})
        return data

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
        record = _record.get()
        if record is not None and "pre_api" not in record:
            record["pre_api"] = time.monotonic()
            self.pending.append(json.dumps(record))


class _SchedStat:
    """The calling thread's ``/proc/thread-self/schedstat``: nanoseconds on a core, nanoseconds runnable in the run
    queue (waiting for a core), time slices. Read with ``pread`` on a kept descriptor (about 5 µs)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    @classmethod
    def of_this_thread(cls) -> _SchedStat:
        try:
            return cls(os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY))
        except OSError:
            return cls(None)

    def read(self) -> tuple[int, int] | None:
        if self.fd is None:
            return None
        try:
            on_cpu, runqueue, _slices = os.pread(self.fd, 128, 0).split()
            return int(on_cpu), int(runqueue)
        except (OSError, ValueError):
            return None


handler = Probe()
