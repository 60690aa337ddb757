"""What the simulated model "generates": each next token, and whether the answer ends there, is a pure function of
the whole context so far (prompt + output), as a greedy model's would be.

The same prompt gives the same completion on every simulated worker, whether it was prefilled there, prefilled
elsewhere and pulled over KV transfer, or recomputed after a preemption; and a request whose prompt is another's
prompt plus its first k output tokens continues with exactly that request's remaining tokens (what request migration
relies on, ``docs/operations.md``). Generated tokens are always pseudo-words of the tokenizer's vocabulary, so the
text round-trips.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from litellm_disagg.sim.tokenizer import NUM_WORDS, WORD_BASE

PromptDigest = bytes


def prompt_digest(prompt_token_ids: Sequence[int]) -> PromptDigest:
    return hashlib.blake2b(array("q", prompt_token_ids).tobytes(), digest_size=16).digest()


class Model:
    """The model's state after a context: an incremental hash of its token ids (O(1) per generated token)."""

    __slots__ = ("_hash",)

    def __init__(self, context: Sequence[int]):
        self._hash = hashlib.blake2b(array("q", context).tobytes(), digest_size=16)

    def _state(self) -> bytes:
        return self._hash.copy().digest()

    def next_token(self) -> int:
        """The greedy next token after the context so far."""
        return WORD_BASE + int.from_bytes(self._state()[:8], "big") % NUM_WORDS

    def ends_after_next(self, mean: int) -> bool:
        """Whether the model "stops by itself" (finish_reason ``stop``) right after the next token: a fixed hazard of
        1/``mean`` per token, so natural answers are 1, 2, ... tokens long with mean ``mean``."""
        return int.from_bytes(self._state()[8:], "big") % max(mean, 1) == 0

    def append(self, token_id: int) -> None:
        self._hash.update(array("q", (token_id,)).tobytes())


def completion(prompt_token_ids: Sequence[int], n: int) -> list[int]:
    """The first ``n`` tokens the model generates after ``prompt_token_ids`` (ignoring where it would stop)."""
    model = Model(prompt_token_ids)
    out: list[int] = []
    for _ in range(n):
        token = model.next_token()
        out.append(token)
        model.append(token)
    return out
