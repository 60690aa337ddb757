"""PromptTokenizer: the token ids a vLLM worker will see for a request, computed by the router.

Two ways, tried in order:

1. **Local**, for a served model with a directory in ``tokenizer.model_dirs``: the model's own tokenizer and chat
   template (``transformers.AutoTokenizer``), exactly as vLLM's OpenAI server uses them: chat requests are rendered
   with the template (``add_generation_prompt`` default true, ``continue_final_message``, ``tools``, ``documents``,
   ``chat_template``, ``chat_template_kwargs``) and the text tokenized with ``add_special_tokens`` default false;
   text completions are tokenized with ``add_special_tokens`` default true; a prompt of token ids is used as is.
   Loading and tokenizing run in a worker thread (``asyncio.to_thread``): the event loop never blocks. Loaded
   tokenizers are cached (LRU); a directory that fails to load is retried after ``RETRY_LOAD_S``.
   Text prompts without special tokens (chat requests by default) are tokenized segment-wise through a token cache
   (``token_cache.py``): a conversation's next turn only tokenizes its new messages, with the same ids a whole
   encoding gives (checked per tokenizer at load; ``max_cached_tokens: 0`` turns it off). Such a next turn, whose
   segments are all cached but its few new ones (``inline_max_new_chars``), is tokenized on the event loop itself:
   a template render, cache lookups and a join (about 0.2 ms for 8k tokens, GIL-bound in a thread as well), cheaper
   than the hand-off to a thread and back; never while another thread uses the tokenizer (no waiting on the loop).
   Instead of a directory, ``python:MODULE:FACTORY`` names a factory that returns a tokenizer with the same
   interface (``apply_chat_template(messages, tokenize=False, ...)`` returning text, and ``__call__(text,
   add_special_tokens=...)`` returning ``input_ids``), for a model whose tokenizer is not a Hugging Face one (the
   simulated worker's: ``python:litellm_disagg.sim.hf_tokenizer:load``).
2. **Remote**, when there is no directory or the local path fails and ``http_fallback`` is on: the worker's
   ``POST /tokenize`` (vLLM's API: ``{"model", "messages", ...}`` or ``{"model", "prompt"}`` -> ``{"tokens"}``).

``tokenize`` returns None when neither works (several prompts, image or audio content, a worker that does not
answer in ``timeout_s``): the request is then routed on load alone. It never raises for a bad request: the worker
will answer that one itself.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.http_client import pooled_client
from litellm_disagg.routing.kv.settings import TokenizerSettings
from litellm_disagg.routing.kv.token_cache import SegmentEncoder, TokenCache
from litellm_disagg.routing.kv.turn_prefix import Tokens, TurnPrefixes

logger = logging.getLogger(__name__)

RETRY_LOAD_S = 60.0

_CHAT_TOKENIZE_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
    "documents",
    "mm_processor_kwargs",
)


class Unsupported(ValueError):
    """A request this module cannot tokenize locally (several prompts, non-text content)."""


@dataclass
class _Loaded:
    tokenizer: Any
    lock: threading.Lock
    segments: SegmentEncoder | None = None
    """Segment-wise encoding through the token cache (None: whole encoding only)."""


class PromptTokenizer:
    def __init__(
        self,
        settings: TokenizerSettings | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        """``client``: the caller's, for the ``/tokenize`` fallback (not closed here); without one, an own client
        created on first use, sending ``headers`` (a worker key)."""
        self.settings = settings or TokenizerSettings()
        self._client = client
        self._headers = dict(headers or {})
        self._own_client = client is None
        self._loaded: OrderedDict[str, _Loaded] = OrderedDict()
        self._failed: dict[str, float] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self.token_cache: TokenCache | None = (
            TokenCache(self.settings.max_cached_tokens) if self.settings.max_cached_tokens > 0 else None
        )
        """Segment token ids, shared by every local tokenizer (None when ``max_cached_tokens`` is 0)."""
        self.turns: TurnPrefixes | None = (
            TurnPrefixes(self.settings.max_cached_tokens)
            if self.token_cache is not None and self.settings.cache_answers and self.settings.reuse_turns
            else None
        )
        """Remembered turns, shared by every local tokenizer (``turn_prefix.py``; None: not kept)."""
        self.inline_encodes = 0
        """Prompts tokenized on the event loop (their segments cached: ``inline_max_new_chars``), not in a thread."""

    async def tokenize(
        self,
        *,
        model: str,
        endpoint: Endpoint,
        fields: Mapping[str, Any],
        worker_url: str | None = None,
    ) -> list[int] | None:
        """Token ids of the request's prompt (``fields``: the OpenAI request's fields), or None.

        ``model`` is the served model name; ``worker_url`` the HTTP root of a worker serving it (for the fallback).
        """
        tokens = await self.tokenize_prompt(model=model, endpoint=endpoint, fields=fields, worker_url=worker_url)
        return None if tokens is None else tokens.ids

    async def tokenize_prompt(
        self,
        *,
        model: str,
        endpoint: Endpoint,
        fields: Mapping[str, Any],
        worker_url: str | None = None,
    ) -> Tokens | None:
        """``tokenize``, with the remembered turn the ids start with when one was used (its block hashes are
        reused by the router)."""
        if endpoint is Endpoint.COMPLETIONS:
            prompt = fields.get("prompt")
            if (
                isinstance(prompt, list)
                and prompt
                and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            ):
                return Tokens(list(prompt))
            if not isinstance(prompt, str):
                return None
        elif not isinstance(fields.get("messages"), list) or not fields.get("messages"):
            return None
        if fields.get("chat_template") is not None:
            # A client-supplied template is code the proxy would run (vLLM refuses it by default): route on load.
            return None
        if model in self.settings.model_dirs:
            try:
                loaded = await self._tokenizer(model)
                if loaded is not None:
                    inline = _encode_inline(loaded, endpoint, fields, self.settings.inline_max_new_chars)
                    if inline is not None:
                        self.inline_encodes += 1
                        return inline
                    # Bounded like the HTTP fallback: past the timeout the request is routed on load alone (the
                    # thread finishes in the background; its result is dropped).
                    async with asyncio.timeout(self.settings.timeout_s):
                        return Tokens(await asyncio.to_thread(_encode_locked, loaded, endpoint, fields))
            except TimeoutError:
                logger.warning(
                    "model %s: local tokenization took over %.1f s; routing on load", model, self.settings.timeout_s
                )
                return None
            except Unsupported as exc:
                logger.debug("model %s: not tokenized locally: %s", model, exc)
            except Exception as exc:  # a template error, an unexpected tokenizer output: let the worker try
                logger.warning("model %s: local tokenization failed: %s", model, exc)
        if self.settings.http_fallback and worker_url:
            remote = await self._remote(model, endpoint, fields, worker_url)
            return None if remote is None else Tokens(remote)
        return None

    async def remember_answer(
        self, *, model: str, fields: Mapping[str, Any], answer: str, block_sizes: Collection[int] = ()
    ) -> int:
        """Puts the segments of a chat's next prompt that hold ``answer`` (the assistant's reply to the chat request
        ``fields``) into the token cache, so that the conversation's next turn only encodes its new question.

        Called when the answer completes (the plugin's success hook), off any request's critical path: the request's
        messages and the answer are rendered as the next turn will render them (``add_generation_prompt`` false) and
        the segments not cached yet are encoded in a worker thread. Only for a model whose tokenizer is loaded and
        segments (never loads one for this); returns the segments encoded (0: nothing to do, or not possible). Never
        raises. With ``reuse_turns``, the rendered conversation itself is remembered too, with its block hashes for
        ``block_sizes`` (``turn_prefix.py``)."""
        loaded = self._loaded.get(model)
        messages = fields.get("messages")
        if (
            not self.settings.cache_answers
            or loaded is None
            or loaded.segments is None
            or not answer
            or not isinstance(messages, list)
            or not messages
            or fields.get("chat_template") is not None
            or fields.get("continue_final_message")
        ):
            return 0
        follow = {
            **fields,
            "messages": [*messages, {"role": "assistant", "content": answer}],
            "add_generation_prompt": False,
        }
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                return await asyncio.to_thread(_remember_locked, loaded, follow, block_sizes)
        except Exception as exc:  # a template error, an unsupported message, a timeout: nothing is cached
            logger.debug("model %s: answer not cached: %s", model, exc)
            return 0

    async def aclose(self) -> None:
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- local --------------------------------------------------------------------------------------------------------

    async def _tokenizer(self, model: str) -> _Loaded | None:
        found = self._loaded.get(model)
        if found is not None:
            self._loaded.move_to_end(model)
            return found
        failed_at = self._failed.get(model)
        if failed_at is not None and time.monotonic() - failed_at < RETRY_LOAD_S:
            return None
        lock = self._loading.setdefault(model, asyncio.Lock())
        async with lock:
            found = self._loaded.get(model)
            if found is not None:
                return found
            directory = self.settings.model_dirs[model]
            try:
                tokenizer = await asyncio.to_thread(_load, directory)
            except Exception as exc:
                logger.warning("model %s: cannot load its tokenizer from %s: %s", model, directory, exc)
                self._failed[model] = time.monotonic()
                return None
            self._failed.pop(model, None)
            segments = None
            if self.token_cache is not None:
                segments = await asyncio.to_thread(
                    SegmentEncoder.build, tokenizer, self.token_cache, self.turns, self.settings.piece_cache
                )
                if segments is None:
                    logger.info("model %s: prompts are tokenized whole (no token cache)", model)
            loaded = self._loaded[model] = _Loaded(tokenizer, threading.Lock(), segments)
            while len(self._loaded) > self.settings.max_cached_tokenizers:
                self._loaded.popitem(last=False)
            return loaded

    # -- remote -------------------------------------------------------------------------------------------------------

    async def _remote(
        self, model: str, endpoint: Endpoint, fields: Mapping[str, Any], worker_url: str
    ) -> list[int] | None:
        body = tokenize_body(model, endpoint, fields)
        try:
            response = await self._http().post(
                f"{worker_url.rstrip('/')}/tokenize", json=body, timeout=self.settings.timeout_s
            )
            response.raise_for_status()
            tokens = response.json().get("tokens")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            logger.debug("model %s: /tokenize on %s failed: %s", model, worker_url, exc)
            return None
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            return tokens
        return None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = pooled_client(
                timeout=self.settings.timeout_s,
                max_connections=256,
                max_keepalive_connections=64,
                headers=self._headers or None,
            )
        return self._client


def tokenize_body(model: str, endpoint: Endpoint, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The body of vLLM's ``POST /tokenize`` for this request."""
    if endpoint is Endpoint.COMPLETIONS:
        body: dict[str, Any] = {"model": model, "prompt": fields.get("prompt")}
        if fields.get("add_special_tokens") is not None:
            body["add_special_tokens"] = fields["add_special_tokens"]
        return body
    body = {"model": model, "messages": fields.get("messages")}
    for key in _CHAT_TOKENIZE_FIELDS:
        if fields.get(key) is not None:
            body[key] = fields[key]
    body.setdefault("add_generation_prompt", True)
    return body


FACTORY_PREFIX = "python:"


def _load(directory: str) -> Any:
    if directory.startswith(FACTORY_PREFIX):
        module, _, factory = directory[len(FACTORY_PREFIX) :].partition(":")
        if not module or not factory:
            raise ValueError(f"{directory!r}: expected python:MODULE:FACTORY")
        return getattr(importlib.import_module(module), factory)()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


INLINE_MAX_PROMPT_CHARS = 1_000_000
"""Prompts with more text than this (about 250k tokens) are never tokenized on the event loop."""


def _encode_inline(loaded: _Loaded, endpoint: Endpoint, fields: Mapping[str, Any], max_new_chars: int) -> Tokens | None:
    """The prompt's ids when they are cheap to get in the calling thread (the event loop): a segment encoder whose
    cache holds all but ``max_new_chars`` of the rendered text, and a tokenizer no other thread is using. Else None:
    tokenize in a thread. Raises what ``encode`` raises (an unsupported request, a template error)."""
    segments = loaded.segments
    # A factory tokenizer with a cache of its own (the simulator's) may offer ``encode_cached(text, max_new_chars)``:
    # the ids, or None when more than ``max_new_chars`` of the text is not cached.
    own = getattr(loaded.tokenizer, "encode_cached", None) if segments is None else None
    if (
        (segments is None and own is None)
        or max_new_chars <= 0
        or _prompt_chars(endpoint, fields) > INLINE_MAX_PROMPT_CHARS
    ):
        return None
    if not loaded.lock.acquire(blocking=False):  # a thread is tokenizing with it: never wait on the event loop
        return None
    try:
        text, add_special_tokens = _prompt_text(loaded.tokenizer, endpoint, fields)
        if add_special_tokens:
            return None
        if segments is None:
            ids = own(text, max_new_chars)
            return None if ids is None else Tokens(ids)
        turn = turn_key(fields.get("messages")) if endpoint is Endpoint.CHAT else None
        return segments.encode_cached(text, max_new_chars, turn)
    finally:
        loaded.lock.release()


def turn_key(messages: Any) -> tuple[int, str] | None:
    """What identifies a conversation up to its last assistant message, for a remembered turn (``turn_prefix.py``):
    how many messages there are up to it, and its text. None without an assistant message with text content.

    A completed answer is remembered under the key of its request's messages with the answer appended; the next
    turn, which resends them and adds its question, has the same key."""
    if not isinstance(messages, list):
        return None
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            content = message.get("content")
            return (i + 1, content) if isinstance(content, str) and content else None
    return None


def _prompt_chars(endpoint: Endpoint, fields: Mapping[str, Any]) -> int:
    """The characters of the request's prompt or messages (text parts only; an upper bound is all it is used for)."""
    if endpoint is Endpoint.COMPLETIONS:
        prompt = fields.get("prompt")
        return len(prompt) if isinstance(prompt, str) else 0
    total = 0
    for message in fields.get("messages") or ():
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p.get("text") or "") for p in content if isinstance(p, Mapping))
    return total


def _encode_locked(loaded: _Loaded, endpoint: Endpoint, fields: Mapping[str, Any]) -> list[int]:
    with loaded.lock:  # a Rust tokenizer shared across threads can fail with "Already borrowed"
        return encode(loaded.tokenizer, endpoint, fields, segments=loaded.segments)


def _remember_locked(loaded: _Loaded, fields: Mapping[str, Any], block_sizes: Collection[int]) -> int:
    with loaded.lock:
        text, add_special_tokens = _prompt_text(loaded.tokenizer, Endpoint.CHAT, fields)
        if add_special_tokens or loaded.segments is None:
            return 0
        messages = fields.get("messages")
        return loaded.segments.remember(text, block_sizes, turn_key(messages) if isinstance(messages, list) else None)


def encode(
    tokenizer: Any, endpoint: Endpoint, fields: Mapping[str, Any], *, segments: SegmentEncoder | None = None
) -> list[int]:
    """What vLLM's OpenAI server feeds the engine for this request, with the model's own tokenizer (``segments``:
    that tokenizer's segment encoder, used for text without special tokens; same ids, new segments only)."""
    text, add_special_tokens = _prompt_text(tokenizer, endpoint, fields)
    return _text_ids(tokenizer, text, add_special_tokens, segments)


def _prompt_text(tokenizer: Any, endpoint: Endpoint, fields: Mapping[str, Any]) -> tuple[str, bool]:
    """The text vLLM tokenizes for this request (a chat rendered with the template) and its ``add_special_tokens``."""
    if endpoint is Endpoint.COMPLETIONS:
        prompt = fields.get("prompt")
        if not isinstance(prompt, str):
            raise Unsupported("prompt is not one string")
        return prompt, _flag(fields, "add_special_tokens", True)
    messages = [_text_message(m) for m in fields.get("messages") or []]
    kwargs: dict[str, Any] = dict(fields.get("chat_template_kwargs") or {})
    kwargs.update(
        tokenize=False,
        add_generation_prompt=_flag(fields, "add_generation_prompt", True),
        continue_final_message=_flag(fields, "continue_final_message", False),
    )
    for key in ("tools", "documents", "chat_template"):
        if fields.get(key) is not None:
            kwargs[key] = fields[key]
    text = tokenizer.apply_chat_template(messages, **kwargs)
    if not isinstance(text, str):
        raise ValueError(f"chat template rendered {type(text).__name__}, expected text")
    return text, _flag(fields, "add_special_tokens", False)


def _text_ids(tokenizer: Any, text: str, add_special_tokens: bool, segments: SegmentEncoder | None) -> list[int]:
    if segments is not None and not add_special_tokens:
        ids = segments.encode(text)
        if ids is not None:
            return ids
    return _ids(tokenizer(text, add_special_tokens=add_special_tokens))


def _flag(fields: Mapping[str, Any], key: str, default: bool) -> bool:
    value = fields.get(key)
    return default if value is None else bool(value)


def _text_message(message: Any) -> dict[str, Any]:
    """A message whose content is text; text parts are joined with newlines (vLLM's "string" content format)."""
    if not isinstance(message, Mapping):
        raise Unsupported("a message is not an object")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return dict(message)
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise Unsupported("message content other than text")
            texts.append(part["text"])
        return {**message, "content": "\n".join(texts)}
    raise Unsupported("message content of an unknown shape")


def _ids(encoded: Any) -> list[int]:
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) or hasattr(encoded, "keys") else encoded
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise ValueError("tokenizer returned something other than a list of token ids")
    return ids
