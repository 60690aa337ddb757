"""Request migration: a streamed answer whose decode worker dies (or whose stream breaks) mid-answer continues on
another decode worker, on the client's same connection, from the prompt plus the tokens already sent.

    plugin's stream hook ─► Migrator.resilient(stream)
        chunks pass through; the StreamLedger notes what reached the client (id, model, created, text, output token
        ids, finish reason) and removes the token-id fields the client did not ask for
      the stream breaks: an exception from it (LiteLLM re-raises the connection error once content was sent), or its
      end without a finish reason (an incomplete chunked read)
        ─► the dead worker goes into failure cooldown and is excluded ─► RoutePlanner picks another decode worker
        ─► the continuation (``Continuation``): ``/v1/completions`` with a token-id prompt = the prompt's ids
           (``/tokenize`` on that worker, the same chat rendering as ``/v1/chat/completions``) + the output ids already
           sent, ``max_tokens``/``min_tokens`` reduced by them, the client's stop conditions and sampling fields kept.
           It runs as a local prefill on the new decode worker (a recovery path: no remote prefill, no KV transfer)
        ─► its chunks rewritten as ``chat.completion.chunk`` with the first stream's id, created and model; usage
           (when the client asked for it) counts the whole answer against the original prompt
      at most ``migration.max_migrations`` times per request; each attempt counted in
      ``litellm_disagg_migrations_total{cause,outcome}``.

Token-exact only where the engine reports token ids: vLLM with ``return_token_ids`` (the strategy asks for them on
every vLLM decode call while migration is on). Greedy decoding then continues exactly as an uninterrupted run would.
Elsewhere (SGLang, TensorRT-LLM, or a stream whose chunks lacked ids) the continuation is a chat completion that
continues the assistant message from its text (``continue_final_message``): re-tokenized text, not guaranteed equal.
Only chat completions are migrated; a text-completion stream fails as before. Non-streamed requests need none of
this: nothing reached the client yet, so LiteLLM's retries (``router_settings.num_retries``) run the whole request
again on another worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.engines.openai_fields import SAMPLING_FIELDS
from litellm_disagg.http_client import pooled_client
from litellm_disagg.observability import metrics
from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.deployments import worker_id_of
from litellm_disagg.routing.migration_settings import MigrationSettings
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import CALL_TYPE_KEY, DisaggRequest
from litellm_disagg.routing.route_plan import NoDecodeWorker, RoutePlanner
from litellm_disagg.runtime_config import RuntimeConfig

logger = logging.getLogger(__name__)

TOKEN_ID_ENGINES = frozenset({"vllm"})
"""Engines whose streamed chunks carry output token ids (``return_token_ids``) and that accept a token-id prompt."""

CLIENT_WANTS_IDS_KEY = "litellm_disagg_return_token_ids"
"""Metadata key where the pre-call hook notes that the client itself asked for ``return_token_ids``."""

_TOKENIZE_FIELDS = (
    "tools",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
    "mm_processor_kwargs",
)
_CARRIED_SAMPLING = tuple(
    f for f in SAMPLING_FIELDS if f not in ("max_tokens", "max_completion_tokens", "n", "logprobs", "top_logprobs")
)


class NotMigratable(Exception):
    """This stream cannot be continued (``outcome`` says why, for the metric)."""

    def __init__(self, message: str, outcome: str = "unsupported"):
        super().__init__(message)
        self.outcome = outcome


class ContinuationBroken(Exception):
    """The continuation's own worker failed (unreachable, 5xx, stream cut): migrate again. ``started``: it had
    streamed part of the answer (the worker broke mid-answer, as the first one did); else nothing was sent yet (a
    connect timeout on a busy worker, a 5xx), and the worker is only cooled down, not excluded."""

    def __init__(self, message: str, *, worker_id: str, started: bool = False):
        super().__init__(message)
        self.worker_id = worker_id
        self.started = started


RETRIES_PER_MIGRATION = 3
"""Continuations that fail before streaming anything, per migration, before the stream's error goes to the client."""


@dataclass
class StreamLedger:
    """What of one streamed answer has reached the client."""

    call_id: str | None
    wants_ids: bool
    wants_usage: bool
    chunk_id: str | None = None
    created: int | None = None
    model: str | None = None
    worker_id: str | None = None
    served_model: str | None = None
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    ids_complete: bool = True
    """Every chunk with text also carried its token ids (else only the text path can continue)."""
    content_chunks: int = 0
    finished: bool = False
    usage_sent: bool = False

    @classmethod
    def for_request(cls, request_data: dict[str, Any]) -> StreamLedger:
        call_id = request_data.get("litellm_call_id")
        options = request_data.get("stream_options")
        return cls(
            call_id=call_id if isinstance(call_id, str) else None,
            wants_ids=client_wants_token_ids(request_data),
            wants_usage=isinstance(options, dict) and bool(options.get("include_usage")),
        )

    def note(self, chunk: Any) -> None:
        """Record a chunk on its way to the client; drop its token ids unless the client asked for them."""
        if self.chunk_id is None:
            self.chunk_id = getattr(chunk, "id", None)
            self.created = getattr(chunk, "created", None)
            self.model = getattr(chunk, "model", None)
        if self.worker_id is None:
            hidden = getattr(chunk, "_hidden_params", None)
            model_id = hidden.get("model_id") if isinstance(hidden, dict) else None
            if isinstance(model_id, str):
                self.worker_id = worker_id_of({"model_info": {"id": model_id}})
        if getattr(chunk, "usage", None) is not None:
            self.usage_sent = True
        for choice in getattr(chunk, "choices", None) or []:
            delta = getattr(choice, "delta", None)
            content = getattr(delta, "content", None) if delta is not None else None
            ids = getattr(choice, "token_ids", None)
            if isinstance(ids, list):
                self.token_ids.extend(t for t in ids if isinstance(t, int))
                if not self.wants_ids:
                    _drop_attr(choice, "token_ids")
            elif content:
                self.ids_complete = False
            if content:
                self.text.append(content)
                self.content_chunks += 1
            if getattr(choice, "finish_reason", None) is not None:
                self.finished = True

    @property
    def sent_text(self) -> str:
        return "".join(self.text)

    @property
    def sent_tokens(self) -> int:
        """Output tokens sent so far: exact with token ids, else about one per chunk with text."""
        return len(self.token_ids) if self.ids_complete else max(len(self.token_ids), self.content_chunks)


def client_wants_token_ids(request_data: dict[str, Any]) -> bool:
    for key in ("metadata", "litellm_metadata"):
        metadata = request_data.get(key)
        if isinstance(metadata, dict) and CLIENT_WANTS_IDS_KEY in metadata:
            return bool(metadata[CLIENT_WANTS_IDS_KEY])
    extra = request_data.get("extra_body")
    return bool(request_data.get("return_token_ids")) or (isinstance(extra, dict) and bool(extra.get("return_token_ids")))


def record_client_wants_token_ids(data: dict[str, Any]) -> None:
    """Pre-call hook: note whether the client asked for token ids (the strategy may ask the engine for them too)."""
    wants = client_wants_token_ids(data)
    for key in ("metadata", "litellm_metadata"):
        metadata = data.get(key)
        if isinstance(metadata, dict):
            metadata[CLIENT_WANTS_IDS_KEY] = wants
            return
    data["metadata"] = {CLIENT_WANTS_IDS_KEY: wants}


def _drop_attr(obj: Any, name: str) -> None:
    try:
        delattr(obj, name)
    except AttributeError:
        try:
            setattr(obj, name, None)
        except Exception:  # noqa: BLE001 (an object that refuses both keeps the field; never break the stream)
            pass


def _is_chat(request_data: dict[str, Any]) -> bool:
    for key in ("metadata", "litellm_metadata"):
        metadata = request_data.get(key)
        if isinstance(metadata, dict) and CALL_TYPE_KEY in metadata:
            return "text_completion" not in str(metadata[CALL_TYPE_KEY])
    return isinstance(request_data.get("messages"), list)


class Migrator:
    """Continues broken streams of one controller's model groups (see the module docstring)."""

    def __init__(
        self,
        settings: MigrationSettings,
        *,
        pool: Callable[[], WorkerPool],
        planner: RoutePlanner,
        cooldown: FailureCooldown,
        accounting: Accounting,
        api_key: str | None = None,
        client: httpx.AsyncClient | None = None,
    ):
        self.settings = settings
        self._pool = pool
        self._planner = planner
        self._cooldown = cooldown
        self._accounting = accounting
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or pooled_client(
            timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
            max_connections=1024,
            max_keepalive_connections=64,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def resilient(self, stream: Any, request_data: dict[str, Any]) -> AsyncIterator[Any]:
        """``stream``'s chunks; when it breaks mid-answer, the rest of the answer from other decode workers."""
        ledger = StreamLedger.for_request(request_data)
        error: BaseException | None = None
        try:
            async for chunk in stream:
                ledger.note(chunk)
                if ledger.worker_id is None and ledger.call_id is not None:
                    ledger.worker_id = self._accounting.worker_of(FlightKey.decode(ledger.call_id))
                if ledger.served_model is None and ledger.worker_id is not None:
                    worker = self._pool().get(ledger.worker_id)
                    ledger.served_model = worker.model if worker is not None else None
                yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # noqa: BLE001 (any break of the stream; re-raised when it cannot be continued)
            error = exc
        if ledger.finished:
            if error is not None:
                raise error
            return
        if ledger.worker_id is None:  # not one of our streams (another model group): as LiteLLM reports it
            if error is not None:
                raise error
            return
        cause = "stream_error" if error is not None else "incomplete"
        async for chunk in self._migrate(ledger, request_data, cause, error):
            yield chunk

    async def _migrate(
        self, ledger: StreamLedger, request_data: dict[str, Any], cause: str, error: BaseException | None
    ) -> AsyncIterator[Any]:
        dead = ledger.worker_id
        assert dead is not None
        excluded: set[str] = {dead}  # workers that broke mid-answer
        self._cooldown.failed(dead)
        migrations = retries = 0
        while True:
            if migrations >= self.settings.max_migrations:
                metrics.MIGRATIONS.labels(cause, "limit").inc()
                logger.warning("stream %s: broken on %s, migration limit (%d) reached", ledger.call_id, dead, migrations)
                raise error or _Incomplete(f"stream ended without a finish reason on {dead}")
            continuation = Continuation(self, ledger, request_data, excluded, avoid=dead)
            try:
                await continuation.open()
                logger.warning(
                    "stream %s: decode worker %s broke after %d tokens (%s); continuing on %s (migration %d)",
                    ledger.call_id, dead, len(ledger.token_ids), cause, continuation.worker.worker_id, migrations + 1,
                )
                async for chunk in continuation.chunks():
                    yield chunk
                metrics.MIGRATIONS.labels(cause, "migrated").inc()
                return
            except ContinuationBroken as exc:
                self._cooldown.failed(exc.worker_id)
                logger.warning("stream %s: continuation on %s broke: %s", ledger.call_id, exc.worker_id, exc)
                error = error or exc
                if exc.started:  # a second crash mid-answer: a migration of its own
                    metrics.MIGRATIONS.labels(cause, "failed").inc()
                    excluded.add(exc.worker_id)
                    dead, cause, retries = exc.worker_id, "stream_error", 0
                    migrations += 1
                    continue
                retries += 1
                if retries > RETRIES_PER_MIGRATION:
                    metrics.MIGRATIONS.labels(cause, "failed").inc()
                    raise error from exc
                await asyncio.sleep(0.2 * retries)
            except NotMigratable as exc:
                metrics.MIGRATIONS.labels(cause, exc.outcome).inc()
                logger.warning("stream %s: broken on %s, not migrated: %s", ledger.call_id, dead, exc)
                raise error or _Incomplete(str(exc)) from exc
            except Exception as exc:  # a bug of ours must not hide the stream's own error
                metrics.MIGRATIONS.labels(cause, "failed").inc()
                logger.exception("stream %s: migration from %s failed", ledger.call_id, dead)
                raise error or _Incomplete(str(exc)) from exc

    # -- what a continuation needs ----------------------------------------------------------------------------------

    async def choose(self, ledger: StreamLedger, excluded: set[str], avoid: str) -> RuntimeConfig:
        """The next decode worker, chosen by the route planner among the model's others (cooldown applies): never
        ``avoid`` (the one that just failed); one that broke earlier only when no other is left."""
        pool = self._pool()
        model = ledger.served_model
        if model is None:
            raise NotMigratable("the broken stream's model is unknown")
        workers = [w for w in pool.for_model(model) if w.role.can_decode and w.worker_id != avoid]
        candidates = [w for w in workers if w.worker_id not in excluded] or workers
        request = DisaggRequest(endpoint=Endpoint.COMPLETIONS, fields={"prompt": "", "n": 2}, request_id="migration")
        try:  # not splittable (n=2): the planner chooses the decode worker only, on load and cooldown
            plan = await self._planner.plan(request, pool, candidates)
        except NoDecodeWorker as exc:
            raise NotMigratable(f"no other decode worker: {exc}", "no_worker") from exc
        return plan.decode

    async def post_json(self, worker: RuntimeConfig, path: str, body: dict[str, Any]) -> Any:
        try:
            r = await self._client.post(f"{worker.server_url}/{path}", json=body, headers=self._auth)
        except httpx.HTTPError as exc:
            raise ContinuationBroken(f"{path}: {type(exc).__name__}: {exc}", worker_id=worker.worker_id) from exc
        if r.status_code >= 500 or r.status_code in (401, 403, 429):
            raise ContinuationBroken(f"{path}: HTTP {r.status_code}", worker_id=worker.worker_id)
        if r.status_code != 200:
            raise NotMigratable(f"{path} refused: HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    def stream(self, worker: RuntimeConfig, path: str, body: dict[str, Any]) -> Any:
        return self._client.stream("POST", f"{worker.base_url}/{path}", json=body, headers=self._auth)

    def track(self, key: FlightKey, worker_id: str) -> None:
        self._accounting.start(key, worker_id)

    def untrack(self, key: FlightKey) -> None:
        self._accounting.finish(key)


class _Incomplete(Exception):
    """A stream that ended without a finish reason and could not be continued."""


class Continuation:
    """One attempt to finish a broken answer on another decode worker."""

    def __init__(
        self, migrator: Migrator, ledger: StreamLedger, request_data: dict[str, Any], excluded: set[str], *, avoid: str
    ):
        self.m = migrator
        self.ledger = ledger
        self.data = request_data
        self.excluded = excluded
        self.avoid = avoid
        self.worker: RuntimeConfig
        self.path = ""
        self.body: dict[str, Any] = {}
        self.by_ids = False
        self.prompt_tokens: int | None = None
        self.sent_before = 0

    async def open(self) -> None:
        if not _is_chat(self.data):
            raise NotMigratable("only chat completion streams are migrated")
        messages = self.data.get("messages")
        if not isinstance(messages, list) or (self.data.get("n") or 1) != 1:
            raise NotMigratable("a chat stream with messages and one choice is needed")
        self.worker = await self.m.choose(self.ledger, self.excluded, self.avoid)
        sent = self.sent_before = self.ledger.sent_tokens
        limit = self.data.get("max_completion_tokens") or self.data.get("max_tokens")
        common: dict[str, Any] = {
            k: self.data[k] for k in _CARRIED_SAMPLING if self.data.get(k) is not None
        } | {"model": self.worker.model, "stream": True, "stream_options": {"include_usage": True}}
        if isinstance(limit, int):
            common["max_tokens"] = limit - sent
        if isinstance(common.get("min_tokens"), int):
            common["min_tokens"] = max(0, common["min_tokens"] - sent)
        self.by_ids = self.worker.engine in TOKEN_ID_ENGINES and self.ledger.ids_complete
        if self.by_ids:
            tokenize = {"model": self.worker.model, "messages": messages} | {
                k: self.data[k] for k in _TOKENIZE_FIELDS if self.data.get(k) is not None
            }
            answer = await self.m.post_json(self.worker, "tokenize", tokenize)
            prompt_ids = answer.get("tokens") if isinstance(answer, dict) else None
            if not isinstance(prompt_ids, list) or not all(isinstance(t, int) for t in prompt_ids):
                raise NotMigratable("the worker's /tokenize answer has no token ids")
            self.prompt_tokens = len(prompt_ids)
            self.path = Endpoint.COMPLETIONS.value
            self.body = common | {"prompt": prompt_ids + self.ledger.token_ids, "return_token_ids": True}
        else:  # text: continue the assistant message (not token-exact)
            self.path = Endpoint.CHAT.value
            partial = {"role": "assistant", "content": self.ledger.sent_text}
            self.body = common | {
                "messages": [*messages, partial],
                "add_generation_prompt": False,
                "continue_final_message": True,
            } | {k: self.data[k] for k in ("tools", "chat_template_kwargs") if self.data.get(k) is not None}
        if "max_tokens" in self.body and self.body["max_tokens"] < 1:
            self.body["max_tokens"] = 0  # nothing left but the finish reason

    async def chunks(self) -> AsyncIterator[Any]:
        ledger = self.ledger
        if self.body.get("max_tokens") == 0:
            yield self._chunk("", None, "length")
            ledger.finished = True
            return
        key = FlightKey.decode(f"{ledger.call_id}#migration-{len(ledger.token_ids)}")
        self.m.track(key, self.worker.worker_id)
        worker_id = self.worker.worker_id
        usage: dict[str, Any] | None = None
        started = False
        try:
            async with self.m.stream(self.worker, self.path, self.body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode("utf-8", "replace")[:200]
                    if r.status_code >= 500 or r.status_code in (401, 403, 429):
                        raise ContinuationBroken(f"HTTP {r.status_code}: {text}", worker_id=worker_id)
                    raise NotMigratable(f"the continuation was refused: HTTP {r.status_code}: {text}")
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        raise ContinuationBroken(f"engine error: {event['error']}", worker_id=worker_id, started=started)
                    if event.get("usage"):
                        usage = event["usage"]
                    for choice in event.get("choices") or []:
                        text, ids, finish = self._read(choice)
                        ledger.text.append(text)
                        ledger.token_ids.extend(ids)
                        ledger.content_chunks += bool(text)
                        if not text and not ids and finish is None:
                            continue
                        if finish is not None:
                            ledger.finished = True
                        started = True
                        yield self._chunk(text, ids, finish)
        except httpx.HTTPError as exc:
            raise ContinuationBroken(f"{type(exc).__name__}: {exc}", worker_id=worker_id, started=started) from exc
        except json.JSONDecodeError as exc:
            raise ContinuationBroken(f"unreadable chunk: {exc}", worker_id=worker_id, started=started) from exc
        finally:
            self.m.untrack(key)
        if not ledger.finished:
            raise ContinuationBroken("ended without a finish reason", worker_id=worker_id, started=started)
        if ledger.wants_usage and not ledger.usage_sent:
            yield self._usage_chunk(usage)

    def _read(self, choice: dict[str, Any]) -> tuple[str, list[int], str | None]:
        if self.by_ids:
            text = choice.get("text") or ""
        else:
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
        ids = choice.get("token_ids")
        ids = [t for t in ids if isinstance(t, int)] if isinstance(ids, list) else []
        finish = choice.get("finish_reason")
        return text, ids, finish if isinstance(finish, str) else None

    def _chunk(self, text: str, ids: list[int] | None, finish: str | None) -> Any:
        from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices

        choice = StreamingChoices(index=0, delta=Delta(content=text or None), finish_reason=finish)
        if self.ledger.wants_ids and ids:
            choice.token_ids = ids  # type: ignore[attr-defined]
        return ModelResponseStream(
            id=self.ledger.chunk_id,
            created=self.ledger.created or int(time.time()),
            model=self.ledger.model,
            object="chat.completion.chunk",
            choices=[choice],
        )

    def _usage_chunk(self, usage: dict[str, Any] | None) -> Any:
        from litellm.types.utils import ModelResponseStream, Usage

        completion = self.ledger.sent_tokens
        prompt = self.prompt_tokens
        if usage is not None and not self.by_ids:  # the continuation's prompt held the answer so far, re-tokenized
            prompt = max(0, int(usage.get("prompt_tokens") or 0) - self.sent_before)
            completion = self.sent_before + int(usage.get("completion_tokens") or 0)
        prompt = prompt or 0
        chunk = ModelResponseStream(
            id=self.ledger.chunk_id,
            created=self.ledger.created or int(time.time()),
            model=self.ledger.model,
            object="chat.completion.chunk",
            choices=[],
        )
        chunk.usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)  # type: ignore[attr-defined]
        return chunk
