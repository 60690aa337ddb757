"""Segment-wise tokenization through the token cache: always the ids a whole tokenization gives.

Tokenizers: the tiny test model's (ChatML, byte-level BPE), SmolLM2's when it is on disk, and small ones built here
that exercise what could break segmenting (``Metaspace`` with ``prepend_scheme: first``, added tokens that strip
whitespace, normalized added tokens, a ``single_word`` token, a tokenizer that truncates).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.kv.settings import TokenizerSettings
from litellm_disagg.routing.kv.token_cache import SegmentEncoder, TokenCache
from litellm_disagg.routing.kv.tokenizer import PromptTokenizer
from litellm_disagg.sized_lru import MAX_DEFERRED

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
INST = (
    "{{ '<s>' }}{% for message in messages %}{% if message['role'] == 'assistant' %} {{ message['content'] }}</s>"
    "{% else %}[INST] {{ message['content'] }} [/INST]{% endif %}{% endfor %}"
)

WORDS = [
    "the", "quick", "brown", "fox", "paged", "attention", "KV", "cache", "blocks", "Hello", "world", "café",
    "naïve", "日本語", "テキスト", "🙂", "x=1;", "def", "f(x):", "return", "12345", "3.14", "don't", "'s", "--",
    "<", ">", "|", "im", "_start", "<|", "|>", "<s", "/s>", "[INST]", "INST", "Special Phrase", "special phrase",
]  # fmt: skip
SPACES = [" ", "  ", "\n", "\n\n", "\t", " \n ", ""]


def corpus() -> list[str]:
    rng = random.Random(7)
    return [" ".join(rng.choice(WORDS) for _ in range(400)) for _ in range(8)]


def bpe_tokenizer(specials: list[Any], template: str = CHATML, *, lowercase: bool = False, vocab: int = 600) -> Any:
    """A byte-level BPE (as GPT-2, Llama 3, Qwen, SmolLM) with the given added tokens (``AddedToken`` or text)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    names = [s.content if isinstance(s, AddedToken) else s for s in specials]
    tok.train_from_iterator(
        corpus(),
        trainer=trainers.BpeTrainer(
            vocab_size=vocab, special_tokens=names, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.add_special_tokens([s for s in specials if isinstance(s, AddedToken) and s.special])
    tok.add_tokens([s for s in specials if isinstance(s, AddedToken) and not s.special])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=names[0])
    fast.chat_template = template
    return fast


def metaspace_tokenizer() -> Any:
    """A SentencePiece-style tokenizer (as Llama 2, Mistral): ``Metaspace`` that prepends "▁" to the first piece
    only (``prepend_scheme: first``), ``<s>``/``</s>`` in the rendered text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(
        corpus(), trainer=trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"])
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = INST
    return fast


def chatml() -> Any:
    return bpe_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])


def stripping(lowercase: bool = True) -> Any:
    """Added tokens that strip whitespace on their left (never cut at) or right, and a normalized added token (with
    a lowercasing normalizer unless ``lowercase`` is false)."""
    from tokenizers import AddedToken

    return bpe_tokenizer(
        [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            AddedToken("<|end|>", rstrip=True, special=True, normalized=False),
            AddedToken("<mask>", lstrip=True, special=True, normalized=False),
            AddedToken(" <|spaced|>", special=True, normalized=False),
            AddedToken("special phrase", special=False, normalized=True),
        ],
        lowercase=lowercase,
    )


def whole(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert isinstance(ids, list)
    return ids


def random_texts(tokenizer: Any, n: int, seed: int) -> list[str]:
    """Words, whitespace and every added token's text, glued in random order."""
    rng = random.Random(seed)
    added = [t.content for t in tokenizer.backend_tokenizer.get_added_tokens_decoder().values()]
    pieces = WORDS + SPACES + added * 6
    return ["".join(rng.choice(pieces) for _ in range(rng.randrange(1, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def qualifying() -> list[tuple[str, Any]]:
    return [("chatml", chatml), ("metaspace-first", metaspace_tokenizer), ("stripping", stripping)]


# -- the segment encoder ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "make"), qualifying())
def test_segment_wise_equals_whole_on_random_texts(name: str, make: Any) -> None:
    tokenizer = make()
    encoder = SegmentEncoder.build(tokenizer, TokenCache(50_000))
    assert encoder is not None, f"{name} should qualify"
    encoder.to_verify = 0  # no safety net: the segment-wise ids themselves are under test
    fresh = SegmentEncoder.build(tokenizer, TokenCache(50_000))
    assert fresh is not None
    fresh.to_verify = 0
    for text in random_texts(tokenizer, 300, seed=len(name)):
        expected = whole(tokenizer, text)
        assert encoder.encode(text) == expected, text
        assert encoder.encode(text) == expected, text  # again, now from the cache
        # a next turn's path (get_mostly_cached, then the new segments encoded)
        assert fresh.encode_cached(text, 10**6).ids == expected, text
    assert encoder.enabled and encoder.cache.stats.hits > 0


def test_segment_wise_equals_whole_for_the_test_model(tiny_tokenizer: Any) -> None:
    encoder = SegmentEncoder.build(tiny_tokenizer, TokenCache(50_000))
    assert encoder is not None and {"<|im_start|>", "<|im_end|>"} <= encoder.cut_at
    encoder.to_verify = 0
    for text in random_texts(tiny_tokenizer, 300, seed=1):
        assert encoder.encode(text) == whole(tiny_tokenizer, text), text


def test_segment_wise_equals_whole_for_smollm2(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    encoder = SegmentEncoder.build(tokenizer, TokenCache(50_000))
    assert encoder is not None
    encoder.to_verify = 0
    for text in random_texts(tokenizer, 200, seed=2):
        assert encoder.encode(text) == whole(tokenizer, text), text
    messages = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi, how can I help?"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(rendered, str) and encoder.encode(rendered) == whole(tokenizer, rendered)


def test_segments_start_at_cut_tokens_and_rebuild_the_text() -> None:
    encoder = SegmentEncoder.build(stripping(), TokenCache(1000))
    assert encoder is not None
    assert encoder.cut_at == {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|end|>"}  # no lstrip, no space first
    text = "hi <|im_start|>user\nq <mask><|im_end|>\n<|end|>  <|im_start|>a"
    parts = encoder.split(text)
    assert "".join(parts) == text
    assert parts == ["hi ", "<|im_start|>user\nq <mask>", "<|im_end|>\n", "<|end|>  ", "<|im_start|>a"]
    assert encoder.split("") == [] and encoder.split("plain") == ["plain"]


def test_a_single_word_added_token_disables_segmenting() -> None:
    from tokenizers import AddedToken

    tokenizer = bpe_tokenizer(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", AddedToken("fox", single_word=True, normalized=False)]
    )
    assert SegmentEncoder.build(tokenizer, TokenCache(1000)) is None


def test_a_probe_mismatch_disables_segmenting(monkeypatch: pytest.MonkeyPatch) -> None:
    # A splitter that cuts inside words: the probe catches it.
    monkeypatch.setattr(SegmentEncoder, "split", lambda self, text: [text[i : i + 3] for i in range(0, len(text), 3)])
    assert SegmentEncoder.build(chatml(), TokenCache(1000)) is None


def test_truncation_or_split_special_tokens_fall_back_to_whole_encoding() -> None:
    tokenizer = chatml()
    encoder = SegmentEncoder.build(tokenizer, TokenCache(1000))
    assert encoder is not None and encoder.usable()
    tokenizer.backend_tokenizer.enable_truncation(4)
    assert not encoder.usable() and encoder.encode("<|im_start|>user\nthe quick brown fox") is None
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.split_special_tokens = True
    assert encoder.encode("<|im_start|>user\nthe quick brown fox") is None


def test_the_first_prompts_are_verified_and_a_mismatch_disables_segmenting() -> None:
    tokenizer = chatml()
    encoder = SegmentEncoder.build(tokenizer, TokenCache(1000))
    assert encoder is not None and encoder.to_verify > 0
    text = "<|im_start|>user\nthe quick brown fox<|im_end|>\n"
    encoder.split = lambda text: [text[:19], text[19:]]  # type: ignore[method-assign]  # cuts a word in two
    assert encoder.encode(text) == whole(tokenizer, text)  # the whole encoding wins
    assert not encoder.enabled and encoder.encode(text) is None


# -- the cache ----------------------------------------------------------------------------------------------------------


def test_token_cache_is_a_bounded_lru() -> None:
    cache = TokenCache(10)
    cache.put(1, "a", (1, 2, 3, 4))
    cache.put(1, "b", (5, 6, 7, 8))
    assert cache.get_many(1, ["a", "x"]) == [(1, 2, 3, 4), None]  # "a" is now the most recently used
    assert cache.get_many(2, ["a"]) == [None]  # another tokenizer's entry
    cache.put(1, "c", (9, 9, 9))  # 11 tokens: "b" goes
    assert cache.get_many(1, ["a", "b", "c"]) == [(1, 2, 3, 4), None, (9, 9, 9)]
    assert cache.tokens == 7 and len(cache) == 2 and cache.stats.evicted == 1
    cache.put(1, "huge", tuple(range(11)))  # longer than the bound: not cached
    assert cache.get_many(1, ["huge"]) == [None] and cache.tokens == 7
    cache.put(1, "a", (1,))  # replaced
    assert cache.tokens == 4
    cache.clear()
    assert cache.tokens == 0 and len(cache) == 0
    with pytest.raises(ValueError):
        TokenCache(0)


def test_evicted_ids_are_freed_off_the_put_that_evicts_them() -> None:
    # A next turn tokenized on the event loop puts its question's ids; the segment that put evicts (an 8k-token
    # conversation: ~50 us of decrefs) is freed later, by release_dropped from a worker thread's encode.
    freed: list[bool] = []

    class Ids(tuple):  # a tuple that says when it is freed  # noqa: SLOT001
        def __del__(self) -> None:
            freed.append(True)

    cache = TokenCache(10)
    cache.put(1, "conversation", Ids(range(8)))
    cache.put(1, "question", (1, 2, 3))  # 11 tokens: the conversation is evicted ...
    assert cache.get_many(1, ["conversation"]) == [None] and cache.stats.evicted == 1
    assert not freed  # ... but not freed by this put
    assert cache.release_dropped() == 1
    assert freed == [True]
    for i in range(MAX_DEFERRED + 5):  # never released: the deferred values stay bounded
        cache.put(1, f"s{i}", (i,) * 10)
    assert len(cache._lru.dropped) <= MAX_DEFERRED


# -- through PromptTokenizer --------------------------------------------------------------------------------------------


def whole_chat(tokenizer: Any, messages: list[dict[str, str]], **kw: Any) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    return whole(tokenizer, text)


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def chat(tokenizer: PromptTokenizer, model: str, messages: list[dict[str, str]]) -> list[int] | None:
    return await tokenizer.tokenize(model=model, endpoint=Endpoint.CHAT, fields={"messages": messages})


async def test_each_turn_only_tokenizes_its_new_messages(tiny_model: Path, tiny_tokenizer: Any) -> None:
    prompts = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}))
    rng = random.Random(3)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": sentence(rng, 300)}]
    first = await chat(prompts, "tiny", messages)
    assert first == whole_chat(tiny_tokenizer, messages)
    cache = prompts.token_cache
    assert cache is not None
    for _ in range(5):
        hits, misses = cache.stats.hit_tokens, cache.stats.misses
        previous = await chat(prompts, "tiny", messages)
        assert previous is not None
        messages += [
            {"role": "assistant", "content": sentence(rng, 40)},
            {"role": "user", "content": sentence(rng, 20)},
        ]
        hits, misses = cache.stats.hit_tokens, cache.stats.misses
        ids = await chat(prompts, "tiny", messages)
        assert ids == whole_chat(tiny_tokenizer, messages)
        # every token of the previous turn came from the cache; only the two new messages' texts were encoded
        assert cache.stats.hit_tokens - hits >= len(previous)
        assert cache.stats.misses - misses == 2
    await prompts.aclose()


async def test_editing_an_earlier_message_gives_the_whole_tokenization(tiny_model: Path, tiny_tokenizer: Any) -> None:
    prompts = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}))
    rng = random.Random(4)
    messages = [{"role": "user", "content": sentence(rng, 50)} for _ in range(3)]
    messages[1]["role"] = "assistant"
    assert await chat(prompts, "tiny", messages) == whole_chat(tiny_tokenizer, messages)
    for edit in ("an edited first message", messages[0]["content"] + " ", messages[0]["content"][:-1], ""):
        edited = [{**messages[0], "content": edit}, *messages[1:]]
        assert await chat(prompts, "tiny", edited) == whole_chat(tiny_tokenizer, edited)
    edited = [*messages[:2], {"role": "user", "content": messages[2]["content"].upper()}]
    assert await chat(prompts, "tiny", edited) == whole_chat(tiny_tokenizer, edited)
    assert await chat(prompts, "tiny", messages) == whole_chat(tiny_tokenizer, messages)  # the original, cached


async def test_models_do_not_share_cached_ids(tiny_model: Path, tiny_tokenizer: Any, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    other_dir = tmp_path / "other"
    chatml().save_pretrained(other_dir)
    other = AutoTokenizer.from_pretrained(other_dir)
    prompts = PromptTokenizer(
        TokenizerSettings(model_dirs={"tiny": str(tiny_model), "other": str(other_dir), "tiny2": str(tiny_model)})
    )
    messages = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 20}]
    a = await chat(prompts, "tiny", messages)
    b = await chat(prompts, "other", messages)
    c = await chat(prompts, "tiny2", messages)
    assert a == whole_chat(tiny_tokenizer, messages) == c
    assert b == whole_chat(other, messages)
    assert a != b
    owners = {loaded.segments.owner for loaded in prompts._loaded.values() if loaded.segments is not None}
    assert len(owners) == 3
    # concurrently, from worker threads, both models at once
    results = await asyncio.gather(*(chat(prompts, m, messages) for m in ("tiny", "other") * 8))
    assert results == [a, b] * 8


async def test_eviction_keeps_the_bound_and_the_ids(tiny_model: Path, tiny_tokenizer: Any) -> None:
    prompts = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}, max_cached_tokens=300))
    rng = random.Random(5)
    conversations = [[{"role": "user", "content": sentence(rng, 60)}] for _ in range(6)]
    for _ in range(2):
        for messages in conversations:
            assert await chat(prompts, "tiny", messages) == whole_chat(tiny_tokenizer, messages)
            messages.append({"role": "assistant", "content": sentence(rng, 30)})
    cache = prompts.token_cache
    assert cache is not None and cache.tokens <= 300 and cache.stats.evicted > 0
    for messages in conversations:  # the early turns were evicted: tokenized again, same ids
        assert await chat(prompts, "tiny", messages[:1]) == whole_chat(tiny_tokenizer, messages[:1])


async def test_cache_off_and_special_tokens_tokenize_whole(tiny_model: Path, tiny_tokenizer: Any) -> None:
    off = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}, max_cached_tokens=0))
    messages = [{"role": "user", "content": "paged attention"}]
    assert await chat(off, "tiny", messages) == whole_chat(tiny_tokenizer, messages)
    assert off.token_cache is None and off._loaded["tiny"].segments is None

    prompts = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}))
    text = "<|im_start|>user\nthe lazy dog<|im_end|>\n"
    fields: dict[str, Any] = {"prompt": text, "add_special_tokens": False}
    assert await prompts.tokenize(model="tiny", endpoint=Endpoint.COMPLETIONS, fields=fields) == whole(
        tiny_tokenizer, text
    )
    cache = prompts.token_cache
    assert cache is not None and cache.stats.misses > 0
    misses = cache.stats.misses
    with_specials = await prompts.tokenize(model="tiny", endpoint=Endpoint.COMPLETIONS, fields={"prompt": text})
    assert with_specials == tiny_tokenizer(text)["input_ids"] and cache.stats.misses == misses  # not segmented
    flagged = await prompts.tokenize(
        model="tiny", endpoint=Endpoint.CHAT, fields={"messages": messages, "add_special_tokens": True}
    )
    rendered = tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert flagged == tiny_tokenizer(rendered, add_special_tokens=True)["input_ids"]


# -- a next turn on the event loop (inline_max_new_chars) ---------------------------------------------------------------


def test_missing_chars_is_a_peek() -> None:
    cache = TokenCache(100)
    cache.put(1, "a", (1,))
    cache.put(1, "bb", (2,))
    stats = (cache.stats.hits, cache.stats.misses, cache.stats.hit_tokens)
    assert cache.missing_chars(1, ["a", "xyz", "bb", "q"]) == 4
    assert cache.missing_chars(2, ["a"]) == 1  # another tokenizer's entry
    assert (cache.stats.hits, cache.stats.misses, cache.stats.hit_tokens) == stats
    cache.put(1, "c", tuple(range(99)))  # evicts the least recently used: still "a" (the peek did not touch it)
    assert cache.get_many(1, ["a", "bb"]) == [None, (2,)]


def test_get_mostly_cached_is_missing_chars_then_get_many() -> None:
    def filled() -> TokenCache:
        cache = TokenCache(100)
        for text, ids in (("a", (1,)), ("bb", (2, 3)), ("c", (4,))):
            cache.put(1, text, ids)
        return cache

    texts = ["bb", "xyz", "a", "bb", "q"]
    for limit in (0, 3, 4, 5):
        one, two = filled(), filled()
        got = one.get_mostly_cached(1, texts, limit)
        if two.missing_chars(1, texts) > limit:
            assert got is None
            assert (one.stats, list(one._entries)) == (filled().stats, list(filled()._entries))  # nothing changed
        else:
            assert got == two.get_many(1, texts)
            assert (one.stats, list(one._entries)) == (two.stats, list(two._entries))  # same hits, same LRU order


def test_encode_cached_only_when_verified_and_mostly_cached() -> None:
    tokenizer = chatml()
    encoder = SegmentEncoder.build(tokenizer, TokenCache(10_000))
    assert encoder is not None
    history = "<|im_start|>user\nthe quick brown fox<|im_end|>\n<|im_start|>assistant\npaged attention<|im_end|>\n"
    turn = history + "<|im_start|>user\nKV cache<|im_end|>\n"
    assert encoder.encode_cached(history, 10_000) is None  # the first prompts are verified in a thread first
    while encoder.to_verify:
        assert encoder.encode(history) == whole(tokenizer, history)
    assert encoder.encode_cached(turn, 5) is None  # its new segment is longer than 5 characters
    assert encoder.encode_cached(turn, 100).ids == whole(tokenizer, turn)
    tokenizer.split_special_tokens = True
    assert encoder.encode_cached(turn, 100) is None


async def test_a_next_turn_is_tokenized_on_the_event_loop_with_the_same_ids(
    tiny_model: Path, tiny_tokenizer: Any
) -> None:
    from litellm_disagg.routing.kv.token_cache import VERIFY_FIRST

    prompts = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}, inline_max_new_chars=2000))
    in_thread = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}, inline_max_new_chars=0))
    rng = random.Random(5)
    messages = [{"role": "user", "content": sentence(rng, 600)}]  # over 2000 characters: a thread
    for _ in range(VERIFY_FIRST + 3):
        before = prompts.inline_encodes
        loaded = prompts._loaded.get("tiny")
        verified = loaded is not None and loaded.segments is not None and loaded.segments.to_verify == 0
        ids = await chat(prompts, "tiny", messages)
        assert ids == whole_chat(tiny_tokenizer, messages) == await chat(in_thread, "tiny", messages)
        # inline once the tokenizer's first prompts are verified, and only a turn that adds little new text
        assert prompts.inline_encodes - before == (1 if verified and len(messages) > 1 else 0)
        messages += [{"role": "assistant", "content": sentence(rng, 30)}, {"role": "user", "content": "why?"}]
    assert prompts.inline_encodes >= 2 and in_thread.inline_encodes == 0
    long_turn = [*messages, {"role": "user", "content": sentence(rng, 600)}]
    before = prompts.inline_encodes
    assert await chat(prompts, "tiny", long_turn) == whole_chat(tiny_tokenizer, long_turn)
    assert prompts.inline_encodes == before
    completion = await prompts.tokenize(model="tiny", endpoint=Endpoint.COMPLETIONS, fields={"prompt": "the fox"})
    assert completion == tiny_tokenizer("the fox")["input_ids"]  # add_special_tokens: whole, in a thread
    assert prompts.inline_encodes == before
    await prompts.aclose()
    await in_thread.aclose()


async def test_a_tokenizer_busy_in_a_thread_is_not_waited_for_on_the_event_loop(
    tiny_model: Path, tiny_tokenizer: Any
) -> None:
    import threading

    prompts = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}))
    rng = random.Random(6)
    messages = [{"role": "user", "content": sentence(rng, 50)}]
    for _ in range(8):
        await chat(prompts, "tiny", messages)
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": sentence(rng, 5)}]
    assert prompts.inline_encodes > 0
    lock = prompts._loaded["tiny"].lock
    lock.acquire()  # another thread's tokenization, finishing in 0.3 s
    threading.Timer(0.3, lock.release).start()
    before = prompts.inline_encodes
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    tick_task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    ids = await chat(prompts, "tiny", messages)
    tick_task.cancel()
    assert ids == whole_chat(tiny_tokenizer, messages)
    assert prompts.inline_encodes == before  # tokenized in the thread once the lock was free
    assert ticks > 3  # the event loop ran meanwhile
    await prompts.aclose()


# -- an answer cached when it completes (remember / remember_answer / KVRouter.answered) --------------------------------


def test_missing_is_a_peek() -> None:
    cache = TokenCache(100)
    cache.put(1, "a", (1,))
    stats = (cache.stats.hits, cache.stats.misses, cache.stats.hit_tokens)
    assert cache.missing(1, ["a", "xyz", "a", "xyz", "q"]) == ["xyz", "q"]
    assert cache.missing(2, ["a"]) == ["a"]
    assert (cache.stats.hits, cache.stats.misses, cache.stats.hit_tokens) == stats


@pytest.mark.parametrize(("name", "make"), [*qualifying(), ("inst", lambda: bpe_tokenizer(["</s>", "<s>"], INST))])
def test_remembered_answers_give_the_whole_ids(name: str, make: Any) -> None:
    """Each answer's segments cached from a render of the history and the answer (as when it completes); the next
    turn, segment-wise with no safety net, must equal a whole encoding, and encode at most the question's segments."""
    tokenizer = make()
    encoder = SegmentEncoder.build(tokenizer, TokenCache(100_000))
    assert encoder is not None, f"{name} should qualify"
    encoder.to_verify = 0
    rng = random.Random(len(name))
    added = [t.content for t in tokenizer.backend_tokenizer.get_added_tokens_decoder().values()]
    pieces = WORDS + SPACES + added

    def content(n: int) -> str:
        return "".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randrange(n)))

    remembered = 0
    for _ in range(12):
        messages = [{"role": "user", "content": content(40)}]
        for _ in range(4):
            rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert encoder.encode(rendered) == whole(tokenizer, rendered), rendered
            answer = content(30)
            remembered += encoder.remember(
                tokenizer.apply_chat_template(
                    [*messages, {"role": "assistant", "content": answer}], tokenize=False, add_generation_prompt=False
                )
            )
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": content(20)}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert encoder.encode(rendered) == whole(tokenizer, rendered), rendered
    assert remembered > 0


def test_remember_caches_each_segments_own_ids() -> None:
    tokenizer = chatml()
    encoder = SegmentEncoder.build(tokenizer, TokenCache(10_000))
    assert encoder is not None
    text = "<|im_start|>user\nthe quick brown fox<|im_end|>\n<|im_start|>assistant\n paged  attention\n<|im_end|>\n"
    assert encoder.remember(text) == 3  # "<|im_end|>\n" once
    assert encoder.remember(text) == 0
    for segment in encoder.split(text):
        assert list(encoder.cache.get_many(encoder.owner, [segment])[0] or ()) == whole(tokenizer, segment)
    tokenizer.split_special_tokens = True
    assert encoder.remember(text + "<|im_start|>user\nKV") == 0  # not usable now: nothing encoded or cached


async def test_an_answer_cached_when_it_completes_leaves_only_the_question(
    tiny_model: Path, tiny_tokenizer: Any
) -> None:
    prompts = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}))
    rng = random.Random(8)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": sentence(rng, 300)}]
    assert await prompts.remember_answer(model="tiny", fields={"messages": messages}, answer="x") == 0  # not loaded
    cache = prompts.token_cache
    assert cache is not None
    for _ in range(VERIFY_TURNS):
        assert await chat(prompts, "tiny", messages) == whole_chat(tiny_tokenizer, messages)
        answer = sentence(rng, 40)
        assert await prompts.remember_answer(model="tiny", fields={"messages": messages}, answer=answer) == 1
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": sentence(rng, 20)}]
        misses = cache.stats.misses
        assert await chat(prompts, "tiny", messages) == whole_chat(tiny_tokenizer, messages)
        assert cache.stats.misses - misses == 1  # the question alone
    fields = {"messages": messages}
    assert await prompts.remember_answer(model="tiny", fields=fields, answer="") == 0
    assert await prompts.remember_answer(model="other", fields=fields, answer="ok") == 0
    assert await prompts.remember_answer(model="tiny", fields={**fields, "chat_template": "{{ 1 }}"}, answer="ok") == 0
    assert await prompts.remember_answer(model="tiny", fields={"messages": "nope"}, answer="ok") == 0
    assert await prompts.remember_answer(model="tiny", fields={**fields, "add_special_tokens": True}, answer="ok") == 0
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert await prompts.remember_answer(model="tiny", fields={"messages": image}, answer="ok") == 0  # never raises
    await prompts.aclose()
    off = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(tiny_model)}, cache_answers=False))
    assert await chat(off, "tiny", messages) == whole_chat(tiny_tokenizer, messages)
    assert await off.remember_answer(model="tiny", fields=fields, answer="a new answer") == 0
    await off.aclose()


VERIFY_TURNS = 6


async def test_the_router_caches_an_answer_for_the_workers_model(tiny_model: Path, tiny_tokenizer: Any) -> None:
    from litellm_disagg.routing.kv.router import KVRouter
    from litellm_disagg.routing.kv.settings import KVRoutingSettings
    from litellm_disagg.routing.pool import WorkerPool
    from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole, WorkerState

    settings = KVRoutingSettings.model_validate(
        {"enabled": True, "tokenizer": {"model_dirs": {"tiny": str(tiny_model)}, "http_fallback": False}}
    )
    router = KVRouter(settings)
    worker = RuntimeConfig(
        worker_id="w0", model="tiny", role=WorkerRole.DECODE, base_url="http://127.0.0.1:1/v1",
        transfer=VllmNixlTransfer(host="127.0.0.1", port=5600), kv_capacity_blocks=100, block_size=16,
        state=WorkerState.READY,
    )  # fmt: skip
    router.sync(WorkerPool.of([worker]))
    messages = [{"role": "user", "content": "the quick brown fox"}]
    assert await chat(router.tokenizer, "tiny", messages) == whole_chat(tiny_tokenizer, messages)
    assert await router.answered("w0", {"messages": messages}, "paged attention") == 1
    assert await router.answered("w9", {"messages": messages}, "other") == 0
    assert await router.answered(None, {"messages": messages}, "other") == 0
    await router.stop()
