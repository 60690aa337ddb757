"""A segment's text encoded piece by piece: the tokenizer's own pre-tokenization split, repeated in Python, and each
piece's ids cached.

Why: a conversation's next turn encodes only its new question (``token_cache.py``, ``turn_prefix.py``), about 50
tokens, yet that one call into ``tokenizers`` cost 220-340 µs in the proxy's sequence against 40-50 µs in a warm
loop. Timed apart, it is the Rust pre-tokenizer (its Oniguruma regex and byte-level tables, evicted from the CPU's
caches by whatever ran before): 270 µs cold for 40 words, while Python's ``regex`` finding the same pieces and a dict
giving their ids take 60 µs cold. A byte-level BPE encodes every pre-tokenized piece on its own, so a piece's ids
never depend on its neighbours: they can be cached by the piece's text.

Exactness. ``tokenizers`` encodes a text (no special tokens added) as: split at added tokens (the raw-text scan that
``SegmentEncoder`` repeats), normalize each remaining run, pre-tokenize it, then apply the model to each piece. Here:

- only tokenizers whose pipeline is known are taken: a ``BPE`` model; no normalizer, or only Unicode normalization
  forms (the identity on ASCII); a pre-tokenizer that is ``ByteLevel`` with its own regex, or a regex ``Split``
  (``Isolated``) followed by ``ByteLevel`` without one (GPT-2, SmolLM2, Llama 3, Qwen 2 ...), never adding a prefix
  space. ``build`` reads that from the tokenizer's own JSON and returns None for anything else;
- only texts of printable ASCII, tabs, newlines and carriage returns are encoded here (else None: the caller uses the
  tokenizer). On them ``\\p{L}``, ``\\p{N}`` and ``\\s`` mean the same in Python's ``regex`` and in Oniguruma, and both
  are backtracking engines with leftmost-first alternation, so the pattern, taken from the tokenizer itself, splits
  the same way;
- added tokens inside the text are found by the caller's scan (``scan``: the raw ones, longest first) and give
  their own id; a text with one that strips whitespace, or with a normalized added token's text anywhere, is
  left to the tokenizer;
- a piece not cached yet is encoded by the tokenizer on its own, which is the same as in context only if the
  pattern splits it alone into itself: checked for every new piece (else None);
- ``build`` compares with the tokenizer on probe texts, and the first ``VERIFY_FIRST`` texts encoded here are also
  encoded by the tokenizer: any difference turns this off for that tokenizer, with a warning.

Not thread-safe on its own: ``SegmentEncoder`` calls it under the tokenizer's lock.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

logger = logging.getLogger(__name__)

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""The split ``ByteLevel(use_regex=True)`` applies (``tokenizers``' ``byte_level.rs``)."""

VERIFY_FIRST = 16
"""Texts per tokenizer encoded here and by the tokenizer too (a difference turns this off)."""

MAX_PIECES = 100_000
"""Pieces cached per tokenizer (about 250 bytes each: 25 MB); past that, the oldest cached half is dropped before the
next text (which may add its own new pieces over the bound)."""

MANY_NEW_PIECES = 64
"""Above this many new pieces, making up over half the text's pieces, the text is left to the tokenizer."""

_NOT_HANDLED = re.compile(r"[^\t\n\r\x20-\x7e]")
"""A character outside printable ASCII, tab, newline and carriage return: the text is left to the tokenizer."""

_IDENTITY_ON_ASCII = frozenset({"NFC", "NFD", "NFKC", "NFKD"})

EncodeBatch = Callable[..., Sequence[Any]]


class PieceEncoder:
    """Encodes ASCII text runs piece by piece through a cache (see the module's docstring). Build with ``build``."""

    def __init__(
        self,
        pattern: Any,
        encode_batch: EncodeBatch,
        scan: re.Pattern[str] | None,
        added_ids: dict[str, int],
        stripping: frozenset[str],
        normalized: Sequence[str],
        reference: Callable[[str], list[int]],
    ):
        self._pattern = pattern
        self._find_all: Callable[[str], list[str]] | None = pattern.findall if pattern.groups == 0 else None
        """The pattern's ``findall``, which returns the matched texts only when it has no capturing group."""
        self._encode_batch = encode_batch
        self._scan = scan
        self._added_ids = added_ids
        self._stripping = stripping
        self._normalized = tuple(normalized)
        self._reference = reference
        self._pieces: dict[str, tuple[int, ...]] = {}
        self._separator: tuple[str, int] | None = next(
            (
                (t, i)
                for t, i in sorted(added_ids.items())
                if scan is not None and scan.fullmatch(t) and t not in stripping
            ),
            None,
        )
        """An added token found by ``scan`` that strips nothing: new pieces are encoded in one call, joined by it."""
        self.enabled = True
        self.to_verify = VERIFY_FIRST
        self.encoded = 0
        """Texts encoded here (not counting those left to the tokenizer)."""
        self.missed_pieces = 0
        """Pieces that were not cached and went to the tokenizer."""

    @classmethod
    def build(
        cls,
        tokenizer: Any,
        scan: re.Pattern[str] | None,
        encode_batch: EncodeBatch,
        reference: Callable[[str], list[int]],
        probes: Sequence[str] = (),
    ) -> PieceEncoder | None:
        """A piece encoder for ``tokenizer`` (a ``transformers`` fast tokenizer) if its pipeline is one this module
        knows and it encodes ``probes`` as ``reference`` does; else None. ``scan`` finds the raw added tokens
        (``SegmentEncoder``'s), ``encode_batch`` is the backend's batch encoder, ``reference`` the whole encoding."""
        try:
            import regex
        except ImportError:  # pragma: no cover - transformers requires it
            return None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        try:
            spec = json.loads(backend.to_str())
            added = list(backend.get_added_tokens_decoder().items())
        except Exception:  # an unusual backend: leave it to the tokenizer
            return None
        source = _split_pattern(spec)
        if source is None:
            return None
        try:
            pattern = regex.compile(source)
        except regex.error:
            return None
        added_ids = {token.content: token_id for token_id, token in added}
        stripping = frozenset(t.content for _, t in added if not t.normalized and (t.lstrip or t.rstrip))
        normalized = [t.content for _, t in added if t.normalized and t.content]
        encoder = cls(pattern, encode_batch, scan, added_ids, stripping, normalized, reference)
        for text in probes:
            ids = encoder._encode(text)
            if ids is not None and ids != reference(text):
                logger.info("piece-wise encoding disabled: it differs from the tokenizer on %r...", text[:60])
                return None
        encoder._pieces.clear()
        encoder.encoded = encoder.missed_pieces = 0
        return encoder

    def encode(self, text: str) -> list[int] | None:
        """The ids ``tokenizers`` gives ``text`` without special tokens, or None when this encoder does not handle
        it (non-ASCII, a stripping or normalized added token, a piece that would not split alone into itself)."""
        if not self.enabled:
            return None
        ids = self._encode(text)
        if ids is not None and self.to_verify > 0:
            self.to_verify -= 1
            if ids != self._reference(text):
                self.enabled = False
                logger.warning("piece-wise tokenization differs from the tokenizer's: turned off for this tokenizer")
                return None
        return ids

    def _encode(self, text: str) -> list[int] | None:
        if _NOT_HANDLED.search(text) is not None or any(n in text for n in self._normalized):
            return None
        runs: list[str | int] = []
        start = 0
        if self._scan is not None:
            for match in self._scan.finditer(text):
                token = match.group()
                if token in self._stripping:
                    return None
                if match.start() > start:
                    runs.append(text[start : match.start()])
                runs.append(self._added_ids[token])
                start = match.end()
        if start < len(text):
            runs.append(text[start:])
        pieces = self._pieces
        if len(pieces) > MAX_PIECES:  # before the lookups: what this text finds cached stays until it is encoded
            for old in list(pieces)[: len(pieces) // 2]:
                del pieces[old]
        split: list[list[str] | int] = []
        looked_up: list[list[tuple[int, ...] | None]] = []
        """Per item of ``split`` (empty for an added token's id): its pieces' cached ids, None where not cached."""
        missing: dict[str, None] = {}
        get = pieces.get
        for run in runs:
            if isinstance(run, int):
                split.append(run)
                looked_up.append([])
                continue
            parts = self._split(run)
            if parts is None:
                return None
            split.append(parts)
            found = list(map(get, parts))
            looked_up.append(found)
            if None in found:
                for piece, ids in zip(parts, found, strict=True):
                    if ids is None:
                        missing[piece] = None
        if len(missing) > MANY_NEW_PIECES and 2 * len(missing) > sum(len(p) for p in split if isinstance(p, list)):
            return None  # mostly new text: the tokenizer alone is faster than splitting here and asking it anyway
        if missing and not self._add(list(missing)):
            return None
        out: list[int] = []
        for item, found in zip(split, looked_up, strict=True):
            if isinstance(item, int):
                out.append(item)
                continue
            if missing and None in found:  # its new pieces are cached now
                found = [pieces[piece] for piece in item]
            out.extend(chain.from_iterable(found))  # type: ignore[arg-type]
        self.encoded += 1
        return out

    def _split(self, run: str) -> list[str] | None:
        """The pre-tokenizer's pieces of ``run``: the pattern's matches and the text between them (``Isolated``)."""
        if self._find_all is not None:
            # The usual case, without a match object per piece: the matches (``findall``, the same scan as
            # ``finditer``) cover ``run`` when, in order, they spell it; then there is no text between them, and no
            # empty match (its ``""`` is looked for), so they are the pieces. Else the exact walk below.
            parts = self._find_all(run)
            if "".join(parts) == run and "" not in parts:
                return parts
        return self._split_walk(run)

    def _split_walk(self, run: str) -> list[str] | None:
        parts: list[str] = []
        at = 0
        for match in self._pattern.finditer(run):
            begin, end = match.span()
            if end == begin:
                return None  # an empty match: not a case we reason about
            if begin > at:
                parts.append(run[at:begin])
            parts.append(run[begin:end])
            at = end
        if at < len(run):
            parts.append(run[at:])
        return parts

    def _add(self, missing: list[str]) -> bool:
        """Encode and cache ``missing`` pieces, each alone; False (nothing cached) when one would not split alone
        into itself. One call to the tokenizer: the pieces joined by an added token (``separator``), whose id then
        cuts the result apart (each piece is pre-tokenized on its own between added tokens); a batch of the pieces
        when there is no such token or its id turns up elsewhere."""
        pattern = self._pattern
        for piece in missing:
            match = pattern.match(piece)
            if match is None or match.end() != len(piece):
                return False
        found = self._joined(missing)
        if found is None:
            found = [tuple(e.ids) for e in self._encode_batch(missing, add_special_tokens=False)]
        pieces = self._pieces
        for piece, ids in zip(missing, found, strict=True):
            pieces[piece] = ids
        self.missed_pieces += len(missing)
        return True

    def _joined(self, missing: list[str]) -> list[tuple[int, ...]] | None:
        if self._separator is None or len(missing) == 1:
            return None
        token, token_id = self._separator
        ids = self._encode_batch([token.join(missing)], add_special_tokens=False)[0].ids
        out: list[tuple[int, ...]] = []
        start = 0
        for i, t in enumerate(ids):
            if t == token_id:
                out.append(tuple(ids[start:i]))
                start = i + 1
        out.append(tuple(ids[start:]))
        return out if len(out) == len(missing) else None

    def __len__(self) -> int:
        return len(self._pieces)


def _split_pattern(spec: dict[str, Any]) -> str | None:
    """The regex the tokenizer described by ``spec`` (its JSON) splits text runs with, if its pipeline is one this
    module knows (see the module's docstring); else None."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout"):
        return None
    if not _identity_on_ascii(spec.get("normalizer")):
        return None
    pre = spec.get("pre_tokenizer")
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            return None
        return GPT2_PATTERN
    if pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if (
        split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or not isinstance(split.get("pattern"), dict)
        or not isinstance(split["pattern"].get("Regex"), str)
    ):
        return None
    if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space") or byte_level.get("use_regex"):
        return None
    return str(split["pattern"]["Regex"])


def _identity_on_ascii(normalizer: Any) -> bool:
    if normalizer is None:
        return True
    if not isinstance(normalizer, dict):
        return False
    if normalizer.get("type") == "Sequence":
        return all(_identity_on_ascii(n) for n in normalizer.get("normalizers") or [])
    return normalizer.get("type") in _IDENTITY_ON_ASCII
