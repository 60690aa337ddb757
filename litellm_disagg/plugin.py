"""The LiteLLM proxy callback. ``proxy_config.yaml`` loads it with::

    litellm_settings:
      callbacks: ["litellm_disagg.plugin.handler"]

On load it waits for the proxy's router, reads the ``litellm_disagg:`` section of the same config file, and attaches
a ``DisaggController`` to the router (following the proxy if it ever replaces its router). As a callback it also:

- drops any client-supplied ``kv_transfer_params`` before the request reaches the router (the strategy drops it too);
- records whether the call is a chat or a text completion, so the prefill uses the same endpoint as the decode;
- tells the controller when a decode call's first token streams back (its prompt is computed: the prefill tokens
  stop counting as queued) and when it ends (its last chunk, or LiteLLM's success/failure event, whichever comes
  first; the events run in background tasks and can lag the client by a while), for its in-flight load.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import sys
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import yaml
from litellm.integrations.custom_logger import CustomLogger

from litellm_disagg import passthrough_guard, stream_finalizer_guard
from litellm_disagg.discovery.factory import make_registry
from litellm_disagg.discovery.registry import Registry
from litellm_disagg.engines.base import Endpoint
from litellm_disagg.gc_freeze import freeze_startup_heap
from litellm_disagg.log_limit import LogLimit, held_note
from litellm_disagg.observability.serve import MetricsServer, serve
from litellm_disagg.routing.controller import DisaggController
from litellm_disagg.routing.deployments import worker_id_of
from litellm_disagg.routing.migration import Migrator, record_client_wants_token_ids
from litellm_disagg.routing.request import (
    client_set_timeout,
    endpoint_of,
    record_call_type,
    record_client_timeout,
    strip_transfer_params,
)
from litellm_disagg.settings import DisaggSettings

logger = logging.getLogger("litellm_disagg")

ENV_CONFIG = "LITELLM_DISAGG_CONFIG"


def arm_faulthandler() -> None:
    """In the proxy: a fatal signal (a segfault in a C extension) writes every thread's Python stack to stderr, the
    proxy's log, instead of ending it without a word. A proxy crashed twice so on 2026-12-02 (dmesg: an incref through
    pointer 0x3 in libpython, once in CI, once under the real-vLLM serving benchmark; cause not found yet). Leaves an
    already armed handler (``PYTHONFAULTHANDLER``, ``-X faulthandler``) as it is."""
    if not faulthandler.is_enabled():
        with contextlib.suppress(Exception):  # no usable stderr (closed, not a file): nothing to arm
            faulthandler.enable(all_threads=True)


class DisaggPlugin(CustomLogger):
    # LiteLLM keeps one CustomLogger per class (it drops "duplicates" of the same type), so the events of every router
    # in this process may reach any instance: each one hands them to all live controllers (call ids are unique).
    _controllers: ClassVar[weakref.WeakSet[DisaggController]] = weakref.WeakSet()

    def __init__(self) -> None:
        super().__init__()
        self.controller: DisaggController | None = None
        self._follower: asyncio.Task[None] | None = None
        self.metrics_server: MetricsServer | None = None
        """Our own metrics port (``metrics.port``), when configured; LiteLLM's ``/metrics`` needs none."""
        self.migrator: Migrator | None = None
        """Continues streams broken mid-answer on another decode worker (``routing/migration.py``), when enabled."""
        self._dropped_lines = LogLimit()
        """One "dropped client-supplied" line per API key each 30 s: a client can send it with every call."""
        # Inside the proxy (which has imported its server module and runs a loop), follow its router; anywhere else
        # (tests, scripts, an SDK Router) call attach() yourself.
        if "litellm.proxy.proxy_server" not in sys.modules:
            return
        arm_faulthandler()
        stream_finalizer_guard.install()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._follower = loop.create_task(self._follow_proxy(), name="litellm-disagg-follow")

    async def attach(self, router: Any, settings: DisaggSettings, registry: Registry | None = None) -> DisaggController:
        """Route ``router``'s disaggregated model groups. Also registers this callback with LiteLLM (the proxy does
        that from its config; an SDK user of the Router gets it here), for the events that end in-flight entries."""
        import litellm

        if self not in litellm.callbacks:
            litellm.callbacks.append(self)
        if self.controller is not None:
            await self.controller.stop()
        await self._close_migrator()
        self.controller = DisaggController(router, settings, registry or make_registry(settings.registry))
        await self.controller.start()
        if settings.migration.enabled:
            c = self.controller
            self.migrator = Migrator(
                settings.migration, pool=lambda: c.pool, planner=c.planner, cooldown=c.cooldown, accounting=c.accounting,
                api_key=getattr(getattr(c, "worker_key", None), "value", None),  # the workers' key, when they need one
            )
            c.strategy.ask_token_ids = True
        DisaggPlugin._controllers.add(self.controller)
        return self.controller

    async def detach(self) -> None:
        import litellm

        if self in litellm.callbacks:
            litellm.callbacks.remove(self)
        if self._follower is not None:
            self._follower.cancel()
            self._follower = None
        if self.controller is not None:
            DisaggPlugin._controllers.discard(self.controller)
            await self.controller.stop()
            self.controller = None
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        await self._close_migrator()

    async def _close_migrator(self) -> None:
        if self.migrator is not None:
            await self.migrator.aclose()
            self.migrator = None

    async def _follow_proxy(self) -> None:
        from litellm.proxy import proxy_server

        _configure_logging()
        settings: DisaggSettings | None = None
        guarded = False
        while True:
            router = proxy_server.llm_router
            if router is not None and (self.controller is None or self.controller.router is not router):
                try:
                    settings = settings or load_settings(getattr(proxy_server, "user_config_file_path", None))
                    await self.attach(router, settings)
                    logger.info("litellm-disagg attached to the proxy's router (registry: %s)", settings.registry)
                    freeze_startup_heap()  # once: full collections no longer walk the start-up heap (gc_freeze.py)
                    if self.metrics_server is None:
                        self.metrics_server = await asyncio.to_thread(serve, settings.metrics)
                except Exception:
                    logger.exception("litellm-disagg could not attach to the proxy's router; retrying")
            if not guarded:  # /vllm/... for our groups: a clean 400 (passthrough_guard.py), once the app serves
                guarded = passthrough_guard.install(getattr(proxy_server, "app", None), _disaggregated_group)
            await asyncio.sleep(0.2 if self.controller is None or not guarded else 1.0)

    # -- proxy hooks -------------------------------------------------------------------------------------------------

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any) -> dict[str, Any]:
        found = strip_transfer_params(data)
        if found and (held := self._dropped_lines.take(getattr(user_api_key_dict, "token", None))) is not None:
            logger.warning("dropped client-supplied %s (key alias %s, user %s, team %s)%s", ", ".join(found),
                           *(getattr(user_api_key_dict, attr, None) for attr in ("key_alias", "user_id", "team_id")),
                           held_note(held))
        record_call_type(data, str(call_type))
        record_client_timeout(data)
        record_client_wants_token_ids(data)
        if self.controller is not None:
            self.controller.keep_installed()
        return data

    def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncIterator[Any]:
        # The proxy streams every chunk to the client through this (LiteLLM 1.108 calls the deployment hook below on
        # the last chunk only): the first chunk ends the prompt's queued tokens and gives the time to first token,
        # each next one an inter-token gap. A stream this plugin did not route (another model group, served by
        # LiteLLM's own strategy) is handed back as it came: no layer and no work per chunk for groups not ours.
        call_id = request_data.get("litellm_call_id") if isinstance(request_data, dict) else None
        if not isinstance(call_id, str) or not any(c.routed(call_id) for c in list(DisaggPlugin._controllers)):
            return response  # type: ignore[no-any-return]
        return self._follow(response, request_data, call_id)

    async def _follow(self, response: Any, request_data: dict[str, Any], call_id: str) -> AsyncGenerator[Any, None]:
        stream = response
        if self.migrator is not None:  # continues a stream broken mid-answer
            stream = self.migrator.resilient(response, request_data)
        async for chunk in stream:
            for controller in list(DisaggPlugin._controllers):
                controller.streamed(call_id, last=False)
            yield chunk

    async def async_post_call_streaming_deployment_hook(
        self, request_data: dict[str, Any], response_chunk: object, call_type: Any
    ) -> object | None:
        # Called by LiteLLM for every chunk of every stream: a dict lookup per live controller, nothing more.
        call_id = request_data.get("litellm_call_id") if isinstance(request_data, dict) else None
        if isinstance(call_id, str):
            last = _finish_reason(response_chunk) is not None
            for controller in list(DisaggPlugin._controllers):
                controller.streamed(call_id, last=last)
        return None

    async def async_log_success_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._finished(kwargs, failed=False, call_failed=False)
        await self._remember_answer(kwargs, response_obj)

    async def _remember_answer(self, kwargs: dict[str, Any], response_obj: Any) -> None:
        # A chat answer that completed: its segments go into the KV router's token cache (in a worker thread), so
        # the conversation's next turn only tokenizes its new question (routing/kv/tokenizer.py remember_answer).
        messages = kwargs.get("messages")
        answer = _answer_text(response_obj)
        if not isinstance(messages, list) or not messages or answer is None:
            return
        litellm_params = kwargs.get("litellm_params")
        if str(kwargs.get("call_type")) in ("text_completion", "atext_completion") or (
            isinstance(litellm_params, dict) and endpoint_of(litellm_params) is Endpoint.COMPLETIONS
        ):
            return  # a text completion's prompt is no chat: nothing a next turn would render
        model_info = litellm_params.get("model_info") if isinstance(litellm_params, dict) else None
        worker_id = worker_id_of({"model_info": model_info}) if isinstance(model_info, dict) else None
        if worker_id is None:
            return
        fields: dict[str, Any] = {"messages": messages}
        optional = kwargs.get("optional_params")
        if isinstance(optional, dict):
            fields.update({k: optional[k] for k in _RENDER_FIELDS if optional.get(k) is not None})
        for controller in list(DisaggPlugin._controllers):
            kv = getattr(controller, "kv", None)
            if kv is not None:
                try:
                    await kv.answered(worker_id, fields, answer)
                except Exception:  # never let caching fail the proxy's logging
                    logger.debug("answer not cached", exc_info=True)

    async def async_log_failure_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        # A client's own short deadline running out says nothing about the worker: no failure cooldown for it.
        fault = _worker_fault(kwargs.get("exception")) and not _client_deadline(kwargs)
        call_id = kwargs.get("litellm_call_id")
        if isinstance(call_id, str):  # counted as failed (by cause) before the end of the call is noted
            for controller in list(DisaggPlugin._controllers):
                controller.request_metrics.finished(call_id, failed=True, worker_fault=fault)
        self._finished(kwargs, failed=fault, call_failed=True)

    def _finished(self, kwargs: dict[str, Any], *, failed: bool, call_failed: bool) -> None:
        call_id = kwargs.get("litellm_call_id")
        if not isinstance(call_id, str):
            return
        litellm_params = kwargs.get("litellm_params")
        model_info = litellm_params.get("model_info") if isinstance(litellm_params, dict) else None
        worker_id = worker_id_of({"model_info": model_info}) if isinstance(model_info, dict) else None
        for controller in list(DisaggPlugin._controllers):
            controller.finished(call_id, worker_id=worker_id, failed=failed)
            controller.call_ended(call_id, worker_id=worker_id, failed=call_failed)


def _disaggregated_group(model: str) -> bool:
    """Whether the proxy's router serves ``model`` through litellm-disagg's deployments."""
    from litellm.proxy import proxy_server

    router = proxy_server.llm_router
    if router is None:
        return False
    try:
        return any(worker_id_of(d) is not None for d in router.get_model_list(model_name=model) or [])
    except Exception:  # never let the guard fail a request that is not ours
        return False


_RENDER_FIELDS = ("tools", "documents", "chat_template_kwargs", "add_special_tokens")
"""Request fields that change how a chat is rendered and tokenized (``routing/kv/tokenizer.py``)."""


def _answer_text(response: object) -> str | None:
    """The text of a chat completion's one answer (None: no choices, several, or no text)."""
    choices = getattr(response, "choices", None)
    if not choices or len(choices) != 1:
        return None
    content = getattr(getattr(choices[0], "message", None), "content", None)
    return content if isinstance(content, str) and content else None


def _finish_reason(chunk: object) -> object | None:
    choices = getattr(chunk, "choices", None)
    if not choices:
        return None
    return getattr(choices[0], "finish_reason", None)


def _client_deadline(kwargs: dict[str, Any]) -> bool:
    """Whether the call failed on the client's own deadline (a timeout of a call whose client set ``timeout``)."""
    import litellm

    return isinstance(kwargs.get("exception"), litellm.Timeout) and client_set_timeout(kwargs)


def _worker_fault(exc: object) -> bool:
    """Whether a failed call says the worker is in trouble (unreachable, 5xx, timeout), not the request."""
    import litellm

    faults = (litellm.APIConnectionError, litellm.InternalServerError, litellm.ServiceUnavailableError, litellm.Timeout)
    return isinstance(exc, faults)


def load_settings(config_path: str | None) -> DisaggSettings:
    """The ``litellm_disagg:`` section of the proxy config (or of ``$LITELLM_DISAGG_CONFIG``); defaults without one."""
    path = os.environ.get(ENV_CONFIG) or config_path
    if not path or not Path(path).is_file():
        return DisaggSettings()
    with open(path) as f:
        return DisaggSettings.from_proxy_config(yaml.safe_load(f))


def _configure_logging() -> None:
    """Make the plugin's own log lines visible in the proxy's output (LiteLLM configures only its own loggers)."""
    if not logger.handlers:
        handler_ = logging.StreamHandler()
        handler_.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler_)
        logger.setLevel(os.environ.get("LITELLM_DISAGG_LOG_LEVEL", "INFO").upper())
        logger.propagate = False


handler = DisaggPlugin()
