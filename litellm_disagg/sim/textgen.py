"""What the simulated model "generates": a pure function of the prompt's token ids and the position.

The same prompt gives the same completion on every simulated worker, whether it was prefilled there, prefilled
elsewhere and pulled over KV transfer, or recomputed after a preemption, which is what greedy-equality tests need.
Generated tokens are always pseudo-words of the tokenizer's vocabulary, so the text round-trips.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from litellm_disagg.sim.tokenizer import NUM_WORDS, WORD_BASE

PromptDigest = bytes


def prompt_digest(prompt_token_ids: Sequence[int]) -> PromptDigest:
    return hashlib.blake2b(array("q", prompt_token_ids).tobytes(), digest_size=16).digest()


def output_token(digest: PromptDigest, position: int) -> int:
    """The token generated at ``position`` (0 = the first completion token) after the prompt with ``digest``."""
    h = hashlib.blake2b(digest + position.to_bytes(8, "big"), digest_size=8).digest()
    return WORD_BASE + int.from_bytes(h, "big") % NUM_WORDS


def natural_length(digest: PromptDigest, mean: int) -> int:
    """Where the model "stops by itself" (finish_reason ``stop``) when the request sets no max_tokens: 1..2*mean-1."""
    return 1 + int.from_bytes(digest[:8], "big") % max(2 * mean - 1, 1)
