"""A deterministic, model-free tokenizer: about one token per word, and exact on the text the simulator generates.

Text is split at special tokens, then into pieces (a word with the whitespace before it, one punctuation character
with the whitespace before it, whitespace before a special token or the end). A piece that is one of the simulator's
own pseudo-words (``" kalo"``, the words generated text is made of) has a fixed id, so ``encode(decode(ids)) == ids``
for generated tokens and a conversation that sends the model's answers back tokenizes them as they were generated.
Any other piece gets a stable hash id (not invertible). Same text, same ids, in every process.

Ids::

    0..3          special tokens (<unk>, <|im_start|>, <|im_end|>, <|endoftext|>)
    256..4351     the pseudo-word vocabulary (what generated text uses)
    4352..31999   hashed pieces
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

UNK, IM_START, IM_END, END_OF_TEXT = 0, 1, 2, 3
SPECIAL_TOKENS: Mapping[str, int] = MappingProxyType({"<|im_start|>": IM_START, "<|im_end|>": IM_END, "<|endoftext|>": END_OF_TEXT})
_SPECIAL_TEXT: Mapping[int, str] = MappingProxyType({v: k for k, v in SPECIAL_TOKENS.items()} | {UNK: "<unk>"})

VOCAB_SIZE = 32_000
WORD_BASE = 256
NUM_WORDS = 4096
HASH_BASE = WORD_BASE + NUM_WORDS

_CONSONANTS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u")
_SYLLABLES = tuple(c + v for c in _CONSONANTS for v in _VOWELS)  # 80


def _word(index: int) -> str:
    return " " + _SYLLABLES[index // len(_SYLLABLES)] + _SYLLABLES[index % len(_SYLLABLES)]


WORDS: tuple[str, ...] = tuple(_word(i) for i in range(NUM_WORDS))
_WORD_IDS: Mapping[str, int] = MappingProxyType({w: WORD_BASE + i for i, w in enumerate(WORDS)})

_SPECIALS = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
_PIECES = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


@functools.lru_cache(maxsize=65_536)
def _piece_id(piece: str) -> int:
    word = _WORD_IDS.get(piece)
    if word is not None:
        return word
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    return HASH_BASE + int.from_bytes(digest, "big") % (VOCAB_SIZE - HASH_BASE)


def encode(text: str) -> list[int]:
    ids: list[int] = []
    for i, segment in enumerate(split_specials(text)):
        if i % 2:
            ids.append(SPECIAL_TOKENS[segment])
        elif segment:
            ids.extend(encode_plain(segment))
    return ids


def split_specials(text: str) -> list[str]:
    """``text`` cut around its special tokens: plain text at even indices (possibly empty), a special token's text at
    odd ones. ``encode`` is the concatenation of each part's ids: a plain part's ids never depend on its neighbours."""
    return _SPECIALS.split(text)


def encode_plain(segment: str) -> list[int]:
    """The ids of text without special tokens (a plain part of ``split_specials``)."""
    return [_piece_id(m.group()) for m in _PIECES.finditer(segment)]


def token_text(token_id: int) -> str:
    """The text of one token. Hashed ids cannot be inverted: they read as ``<#ID>``."""
    if WORD_BASE <= token_id < HASH_BASE:
        return WORDS[token_id - WORD_BASE]
    special = _SPECIAL_TEXT.get(token_id)
    return special if special is not None else f"<#{token_id}>"


def decode(token_ids: Sequence[int]) -> str:
    return "".join(token_text(t) for t in token_ids)


def is_valid_token(token_id: int) -> bool:
    return 0 <= token_id < VOCAB_SIZE
