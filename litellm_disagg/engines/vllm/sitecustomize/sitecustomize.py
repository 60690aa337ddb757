"""Put on PYTHONPATH of a vLLM worker by the litellm-disagg wrapper (never imported by the proxy).

NIXL's progress thread runs with a delay of 0 (``nixl_agent`` hard-codes ``pthrDelay = 0``) and so busy-spins a whole
core per idle engine. On CPU-only hosts, where the cores are the engine's compute, the wrapper sets
``LITELLM_DISAGG_NIXL_PROGRESS_DELAY_US`` and this module gives every NIXL agent that delay between progress rounds:
measured here, 1000 us costs about 3% of a core per idle agent instead of 100%.

The thread stays on. Turning it off (what this module did before) saved the same CPU but left UCX progress to vLLM's
own polling, which stops when the prefill engine is idle: a decode worker that joined at runtime then waited
forever for its first transfer from a prefill worker that had nothing else to do (UCX's TCP transport serves a
remote read only when the serving side makes progress). ``LITELLM_DISAGG_NIXL_PROGRESS_THREAD=0`` still turns the
thread off, for experiments.

The patch is applied lazily, when NIXL's ``_api`` module is first imported, so importing this file costs nothing and
leaves NIXL's import-time environment handling alone.

KV events: vLLM's ZMQ publisher binds only wildcard endpoints (``tcp://*:PORT``, every interface) and *connects* to
a concrete one. With ``LITELLM_DISAGG_KV_EVENTS_BIND`` set (the wrapper sets it to the worker's own address), that
exact endpoint is bound instead, so the event socket listens on the worker's address only. Applied lazily too, when
``vllm.distributed.kv_events`` is first imported.

CPU pinning: on a CPU platform vLLM's NIXL connector worker pins the thread that builds it, the worker process's main
thread (vLLM 0.32, ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py``,
``NixlBaseConnectorWorker.__init__``: "reserve different cores for start_load_kv() from model_forward()",
``os.sched_setaffinity(0, [last core of each NUMA node])``), and every thread started from it afterwards (the push
connector's writer thread among them). That main thread also runs the forward pass and spins (``sched_yield``) in
vLLM's shared-memory queue reads (``vllm/distributed/device_communicators/shm_broadcast.py``), so every vLLM worker on
a host ends up on the same single core: on a small host one engine's spinning worker starved the other's for 20-60 s
(a runnable thread that got no CPU time: the light-load decode stalls of docs/operations.md). With
``LITELLM_DISAGG_NIXL_CPU_PIN=0`` (the wrapper sets it on CPU hosts) that pin is skipped and the worker keeps the
affinity it was started with. Applied lazily, when that module is first imported.
"""

import importlib.abc
import importlib.util
import os
import sys

_NIXL_TARGETS = frozenset({"nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api"})
_KV_EVENTS_TARGET = "vllm.distributed.kv_events"
_NIXL_WORKER_TARGET = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
_TARGETS = _NIXL_TARGETS | {_KV_EVENTS_TARGET, _NIXL_WORKER_TARGET}


def _unpin() -> bool:
    return os.environ.get("LITELLM_DISAGG_NIXL_CPU_PIN") == "0"


class _OsWithoutPinning:
    """``os`` for vLLM's NIXL worker module, with ``sched_setaffinity`` a no-op (everything else is ``os``'s)."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def sched_setaffinity(pid, mask):
        return None


def _patch_nixl_worker(module):
    # base_worker.py calls os.sched_setaffinity only to pin the connector's thread (NixlBaseConnectorWorker.__init__).
    if _unpin() and getattr(module, "os", None) is os:
        module.os = _OsWithoutPinning()


def _settings():
    thread = os.environ.get("LITELLM_DISAGG_NIXL_PROGRESS_THREAD", "1") != "0"
    raw = os.environ.get("LITELLM_DISAGG_NIXL_PROGRESS_DELAY_US", "")
    try:
        delay_us = max(0, int(raw)) if raw else None
    except ValueError:
        delay_us = None
    return thread, delay_us


def _patch_kv_events(module):
    bind = os.environ.get("LITELLM_DISAGG_KV_EVENTS_BIND")
    publisher = getattr(module, "ZmqEventPublisher", None)
    if not bind or publisher is None or getattr(publisher, "_litellm_disagg_bind", None) == bind:
        return
    original = publisher.__dict__["_is_bind_endpoint"].__func__

    def _is_bind_endpoint(endpoint):
        return endpoint == bind or original(endpoint)

    publisher._is_bind_endpoint = staticmethod(_is_bind_endpoint)
    publisher._litellm_disagg_bind = bind


def _patch(module):
    if module.__name__ == _KV_EVENTS_TARGET:
        _patch_kv_events(module)
        return
    if module.__name__ == _NIXL_WORKER_TARGET:
        _patch_nixl_worker(module)
        return
    thread, delay_us = _settings()
    config_cls = getattr(module, "nixl_agent_config", None)
    if config_cls is not None and not thread and not getattr(config_cls, "_litellm_disagg_patched", False):
        original_init = config_cls.__init__

        def __init__(self, *args, **kwargs):
            kwargs["enable_prog_thread"] = False
            original_init(self, *args, **kwargs)

        config_cls.__init__ = __init__
        config_cls._litellm_disagg_patched = True
    bindings = getattr(module, "nixlBind", None)
    agent_cls = getattr(bindings, "nixlAgent", None)
    if delay_us and agent_cls is not None and not getattr(bindings, "_litellm_disagg_paced", False):
        # nixl_agent sets agent_config.pthrDelay = 0 just before this call: set the delay on the way in.
        def paced_agent(name, agent_config, *args, **kwargs):
            agent_config.pthrDelay = delay_us
            return agent_cls(name, agent_config, *args, **kwargs)

        bindings.nixlAgent = paced_agent
        bindings._litellm_disagg_paced = True


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


if _settings() != (True, None) or os.environ.get("LITELLM_DISAGG_KV_EVENTS_BIND") or _unpin():
    sys.meta_path.insert(0, _Finder())
