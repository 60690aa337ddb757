"""The simulated worker's tokenizer and chat template behind the Hugging Face interface the router's local
tokenization uses, so a proxy can tokenize for simulated workers itself instead of asking their ``/tokenize``::

    kv_routing:
      tokenizer:
        model_dirs: {sim-model: "python:litellm_disagg.sim.hf_tokenizer:load"}

Same ids as the simulated worker's ``/tokenize`` and its engine.

Text is encoded part by part (``tokenizer.split_specials``: the text between special tokens, whose ids never depend
on what surrounds it), each part through a bounded LRU of part text -> ids (``PartCache``). A conversation resends
its history every turn; its next turn then encodes only its new messages, as the router's token cache does for a
Hugging Face tokenizer (``routing/kv/token_cache.py``, which needs a ``tokenizers`` backend this tokenizer does not
have). Without it, a 4,000-word prompt costs the proxy 3-6 ms of pure-Python encoding on every turn, under the GIL
(docs/benchmarks.md, "multi-turn: where the KV arm's proxy time went").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from litellm_disagg.sim import tokenizer
from litellm_disagg.sim.chat_template import render_chat
from litellm_disagg.sim.protocol import ChatMessage
from litellm_disagg.sized_lru import SizedLRU

DEFAULT_MAX_CACHED_TOKENS = 1_000_000
"""8 MB of id references (plus the ids no other cache holds: up to 28 bytes each)."""

MIN_CACHED_CHARS = 64
"""Shorter parts are encoded every time (cheaper than a cache entry)."""


class PartCache:
    """Bounded LRU of a plain part's text -> its ids (a tuple, as the router's token cache keeps a segment's: a list
    extends from it without making an int per id, 10x faster than from an ``array('H')``, 40 us less per 4,000-token
    prompt); ``max_tokens`` bounds the sum of the cached parts' lengths (a part longer than that is not cached).
    Thread-safe."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_CACHED_TOKENS):
        self.max_tokens = max_tokens
        self.hits = 0
        self.misses = 0
        self._lru: SizedLRU[str, tuple[int, ...]] = SizedLRU(max_tokens, len)

    @property
    def tokens(self) -> int:
        return self._lru.total

    def __len__(self) -> int:
        return len(self._lru)

    def missing_chars(self, parts: Sequence[str]) -> int:
        """Characters of ``parts`` (plain parts) that ``ids`` would encode now: the uncached ones (a peek)."""
        entries = self._lru.entries
        with self._lru.lock:
            return sum(len(p) for p in parts if len(p) < MIN_CACHED_CHARS or p not in entries)

    def ids(self, part: str) -> tuple[int, ...] | list[int]:
        """``tokenizer.encode_plain(part)``, from the cache when it holds ``part``."""
        if len(part) < MIN_CACHED_CHARS:
            return tokenizer.encode_plain(part)
        found = self._lru.get(part)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        ids = tuple(tokenizer.encode_plain(part))
        self._lru.put(part, ids)  # another thread may have put the same ids meanwhile: replaced, same value
        return ids


class SimHFTokenizer:
    def __init__(self, max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS):
        self.parts = PartCache(max_cached_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
        **_: Any,
    ) -> str | list[int]:
        text = render_chat(
            [ChatMessage.model_validate(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
        )
        return self.encode(text) if tokenize else text

    def __call__(self, text: str, *, add_special_tokens: bool = False) -> dict[str, list[int]]:
        # The simulator has no BOS token: add_special_tokens changes nothing, as on its /tokenize.
        return {"input_ids": self.encode(text)}

    def encode_cached(self, text: str, max_new_chars: int) -> list[int] | None:
        """``encode(text)`` when at most ``max_new_chars`` characters of it are not cached (cheap enough for the
        router to encode on its event loop: ``routing/kv/tokenizer.py``); else None, with nothing encoded."""
        parts = tokenizer.split_specials(text)
        if self.parts.missing_chars(parts[::2]) > max_new_chars:
            return None
        return self._join(parts)

    def encode(self, text: str) -> list[int]:
        """``tokenizer.encode(text)``, each plain part through the cache."""
        return self._join(tokenizer.split_specials(text))

    def _join(self, parts: list[str]) -> list[int]:
        ids: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:
                ids.append(tokenizer.SPECIAL_TOKENS[part])
            elif part:
                ids.extend(self.parts.ids(part))
        return ids


def load() -> SimHFTokenizer:
    return SimHFTokenizer()
