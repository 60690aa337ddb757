"""Piece-wise encoding of new text (``piece_cache.py``): always the ids the tokenizer itself gives, or None.

Tokenizers: byte-level BPEs with the GPT-2 split (the tiny test model's, SmolLM2's when on disk, a ChatML one built
here) and with a Llama 3 style regex ``Split`` before ``ByteLevel``; ones it must refuse (``Metaspace``, a lowercasing
normalizer) or partly refuse (added tokens that strip whitespace, a normalized added token).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from litellm_disagg.routing.kv import piece_cache
from litellm_disagg.routing.kv.piece_cache import PieceEncoder
from litellm_disagg.routing.kv.token_cache import SegmentEncoder, TokenCache

from .test_token_cache import chatml, corpus, metaspace_tokenizer, stripping, whole

LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
ASCII_WORDS = [
    "the", "quick", "Brown", "fox", "KV", "cache", "don't", "It's", "'S", "we'LL", "x=1;", "f(x):", "return", "12345",
    "3.14", "--", "<", ">", "|", "<|", "|>", "im_start", "[INST]", "a\tb", "\r\n", "...", "!!", "'", "\"q\"", "#", "",
]  # fmt: skip
ASCII_SPACES = [" ", "  ", "   ", "\n", "\n\n", "\t", " \n ", "\r", " \t ", ""]


def llama3_tokenizer() -> Any:
    """A byte-level BPE whose split is a regex ``Split`` (Llama 3's pattern) and ``ByteLevel`` without its own."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.train_from_iterator(
        corpus(),
        trainer=trainers.BpeTrainer(
            vocab_size=700, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eot_id|>")


def ascii_texts(tokenizer: Any, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    added = [t.content for t in tokenizer.backend_tokenizer.get_added_tokens_decoder().values()]
    parts = ASCII_WORDS * 3 + ASCII_SPACES * 3 + added
    return ["".join(rng.choice(parts) for _ in range(rng.randrange(1, 80))) for _ in range(n)]


def pieces_of(tokenizer: Any) -> PieceEncoder:
    segments = SegmentEncoder.build(tokenizer, TokenCache(100_000))
    assert segments is not None and segments.pieces is not None
    segments.pieces.to_verify = 0  # no safety net: the piece-wise ids themselves are under test
    return segments.pieces


def tiny(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.mark.parametrize("name", ["chatml", "llama3", "tiny", "smollm2"])
def test_piece_wise_equals_the_tokenizer_on_random_ascii_texts(name: str, tiny_model: Path,
                                                              request: pytest.FixtureRequest) -> None:
    smollm2 = request.getfixturevalue("smollm2_dir") if name == "smollm2" else None
    from transformers import AutoTokenizer

    tokenizer = {
        "chatml": chatml,
        "llama3": llama3_tokenizer,
        "tiny": lambda: tiny(tiny_model),
        "smollm2": lambda: AutoTokenizer.from_pretrained(smollm2),
    }[name]()
    encoder = pieces_of(tokenizer)
    handled = 0
    for text in ascii_texts(tokenizer, 400, seed=len(name)):
        ids = encoder.encode(text)
        if ids is not None:
            handled += 1
            assert ids == whole(tokenizer, text), text
            assert encoder.encode(text) == ids, text  # again, every piece now cached
    assert handled > 350 and encoder.missed_pieces > 0 and len(encoder) > 0


def test_the_one_call_for_new_pieces_gives_what_a_batch_gives() -> None:
    tokenizer = chatml()
    joined, batched = pieces_of(tokenizer), pieces_of(tokenizer)
    batched._separator = None
    assert joined._separator is not None
    for text in ascii_texts(tokenizer, 200, seed=11):
        assert joined.encode(text) == batched.encode(text) == whole(tokenizer, text), text


def test_text_it_cannot_vouch_for_is_left_to_the_tokenizer() -> None:
    tokenizer = stripping(lowercase=False)  # no normalizer: the encoder is built
    encoder = pieces_of(tokenizer)
    assert encoder.encode("café au lait") is None  # not ASCII
    assert encoder.encode("bell\x07 and \x1c") is None  # control characters
    assert encoder.encode("a <mask> b") is None  # strips whitespace on its left
    assert encoder.encode("<|end|> b") is None  # strips on its right
    assert encoder.encode("a special phrase b") is None  # a normalized added token's text
    assert encoder.encode("a <|im_start|>user\nb<|im_end|>") == whole(tokenizer, "a <|im_start|>user\nb<|im_end|>")
    handled = 0
    for text in ascii_texts(tokenizer, 300, seed=5):
        ids = encoder.encode(text)
        if ids is not None:
            handled += 1
            assert ids == whole(tokenizer, text), text
    assert handled > 0


@pytest.mark.parametrize("make", [metaspace_tokenizer, stripping], ids=["metaspace", "lowercase-normalizer"])
def test_a_pipeline_it_does_not_know_gets_no_piece_encoder(make: Any) -> None:
    segments = SegmentEncoder.build(make(), TokenCache(10_000))
    assert segments is not None and segments.pieces is None


def test_a_piece_that_would_not_split_alone_into_itself_is_not_cached() -> None:
    encoder = pieces_of(chatml())
    assert encoder._add(["two words"]) is False and len(encoder) == 0
    assert encoder._add([" two", " words"]) is True and len(encoder) == 2


def test_a_difference_from_the_tokenizer_turns_it_off(caplog: pytest.LogCaptureFixture) -> None:
    encoder = pieces_of(chatml())
    encoder.to_verify = 2
    assert encoder.encode("hello world") is not None  # verified: the same
    encoder._reference = lambda text: [0]  # the tokenizer now disagrees
    assert encoder.encode("hello world") is None
    assert not encoder.enabled and encoder.encode("hello") is None
    assert "differs" in caplog.text


def test_mostly_new_long_text_is_left_to_the_tokenizer() -> None:
    tokenizer = chatml()
    encoder = pieces_of(tokenizer)
    rng = random.Random(3)
    novel = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(9)) for _ in range(400))
    assert encoder.encode(novel) is None and encoder.missed_pieces == 0
    short = " ".join(novel.split()[:20])  # few new pieces: encoded here, then cached
    assert encoder.encode(short) == whole(tokenizer, short) and encoder.missed_pieces > 0


def test_the_cache_stays_bounded_and_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(piece_cache, "MAX_PIECES", 50)
    tokenizer = chatml()
    encoder = pieces_of(tokenizer)
    for text in ascii_texts(tokenizer, 200, seed=9):
        ids = encoder.encode(text)
        assert ids is None or ids == whole(tokenizer, text), text
        assert len(encoder) <= 50 + 80 * 4  # at most one text's new pieces over the bound


def test_a_next_turn_encodes_its_new_segments_piece_wise(tiny_model: Path) -> None:
    tokenizer = tiny(tiny_model)
    segments = SegmentEncoder.build(tokenizer, TokenCache(100_000))
    assert segments is not None and segments.pieces is not None
    segments.to_verify = 0
    history = [{"role": "user", "content": "Tell me about paged attention and the KV cache."}]
    first = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    assert segments.encode(first) == whole(tokenizer, first)
    follow = history + [{"role": "assistant", "content": "It stores keys."}, {"role": "user", "content": "And then?"}]
    second = tokenizer.apply_chat_template(follow, tokenize=False, add_generation_prompt=True)
    before = segments.pieces.encoded
    tokens = segments.encode_cached(second, 10_000)
    assert tokens is not None and tokens.ids == whole(tokenizer, second)
    assert segments.pieces.encoded > before


def test_a_failing_piece_encoder_is_turned_off_and_the_tokenizer_used(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = chatml()
    segments = SegmentEncoder.build(tokenizer, TokenCache(10_000))
    assert segments is not None and segments.pieces is not None
    segments.to_verify = 0

    def broken(self: PieceEncoder, text: str) -> list[int] | None:
        raise KeyError(text)

    monkeypatch.setattr(PieceEncoder, "encode", broken)
    text = "<|im_start|>user\nhello there<|im_end|>\n"
    assert segments.encode(text) == whole(tokenizer, text)
    assert segments.pieces is None


async def test_the_setting_turns_piece_wise_encoding_off_with_the_same_ids(tiny_model: Path) -> None:
    from litellm_disagg.engines.base import Endpoint
    from litellm_disagg.routing.kv.settings import TokenizerSettings
    from litellm_disagg.routing.kv.tokenizer import PromptTokenizer

    tokenizer = tiny(tiny_model)
    messages = [{"role": "user", "content": "paged attention, then the KV cache"}]
    expected = whole(tokenizer, tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    for on in (True, False):
        prompts = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}, piece_cache=on))
        ids = await prompts.tokenize(model="tiny", endpoint=Endpoint.CHAT, fields={"messages": messages})
        segments = prompts._loaded["tiny"].segments
        assert ids == expected and segments is not None and (segments.pieces is not None) is on
        await prompts.aclose()


def test_the_split_from_findall_equals_the_walk_over_matches() -> None:
    """``_split``'s ``findall`` path (matches that spell the run) gives the walk's pieces: on random ASCII with the
    GPT-2 pattern, and where the matches leave text between them, match empty or the pattern has a group (the
    walk's own answer then)."""
    import regex

    def encoder(source: str) -> PieceEncoder:
        return PieceEncoder(regex.compile(source), lambda *a, **k: [], None, {}, frozenset(), (), lambda t: [])

    gpt2 = encoder(piece_cache.GPT2_PATTERN)
    assert gpt2._find_all is not None
    rng = random.Random(4)
    alphabet = "ab Z 9'\t\n\r.,-  zz's're 12"
    for _ in range(500):
        run = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        assert gpt2._split(run) == gpt2._split_walk(run)
    gaps = encoder(r"[a-z]+")  # the text between matches is a piece too (Isolated)
    assert gaps._split("ab, cd!") == gaps._split_walk("ab, cd!") == ["ab", ", ", "cd", "!"]
    empty = encoder(r"[a-z]*")
    assert empty._split("ab, cd") is None and empty._split_walk("ab, cd") is None
    assert empty._split("abc") is None  # its matches "abc" and "" spell the run
    grouped = encoder(r"([a-z]+)|[^a-z]+")
    assert grouped._find_all is None and grouped._split("ab, cd") == ["ab", ", ", "cd"]
