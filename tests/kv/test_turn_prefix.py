"""A remembered turn (``routing/kv/turn_prefix.py``): a next turn reuses its ids and block hashes, always with the ids
and hashes a whole tokenization gives."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.kv.block_hash import ROOT, PromptBlocks, chain_hashes, root_hash
from litellm_disagg.routing.kv.token_cache import SegmentEncoder, TokenCache
from litellm_disagg.routing.kv.tokenizer import turn_key
from litellm_disagg.routing.kv.turn_prefix import Tokens, TurnPrefix, TurnPrefixes
from tests.kv.test_token_cache import INST, SPACES, WORDS, bpe_tokenizer, qualifying, whole

BLOCK_SIZES = (1, 3, 16)


def encoder_for(tokenizer: Any, *, turns: bool = True) -> SegmentEncoder:
    encoder = SegmentEncoder.build(tokenizer, TokenCache(1_000_000), TurnPrefixes(1_000_000) if turns else None)
    assert encoder is not None
    encoder.to_verify = 0
    return encoder


def render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    assert isinstance(text, str)
    return text


@pytest.mark.parametrize(("name", "make"), [*qualifying(), ("inst", lambda: bpe_tokenizer(["</s>", "<s>"], INST))])
def test_a_next_turn_from_a_remembered_turn_gives_the_whole_ids_and_hashes(name: str, make: Any) -> None:
    """Random conversations (added tokens inside messages too), each answer remembered as it completes: every next
    turn's ids and block hashes equal a whole encoding's, and most turns start with a remembered one."""
    tokenizer = make()
    encoder = encoder_for(tokenizer)
    rng = random.Random(len(name))
    added = [t.content for t in tokenizer.backend_tokenizer.get_added_tokens_decoder().values()]
    pieces = WORDS + SPACES + added

    def content(n: int) -> str:
        return "".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randrange(n)))

    reused = turns = 0
    for _ in range(12):
        messages = [{"role": "user", "content": content(40)}]
        for _ in range(4):
            answer = content(30)
            done = [*messages, {"role": "assistant", "content": answer}]
            encoder.remember(render(tokenizer, done, False), (16,), turn_key(done))
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": content(20)}]
            rendered = render(tokenizer, messages, True)
            tokens = encoder.encode_cached(rendered, 10**6, turn_key(messages))
            assert tokens is not None
            expected = whole(tokenizer, rendered)
            assert tokens.ids == expected, rendered
            turns += 1
            if tokens.prefix is not None:
                reused += 1
                assert tokens.ids[: len(tokens.prefix.ids)] == tokens.prefix.ids
                for size in BLOCK_SIZES:
                    for namespace in (None, "adapter"):
                        parent = ROOT if namespace is None else root_hash(namespace)
                        blocks = PromptBlocks(tokens.ids, namespace=namespace, known=tokens.prefix)
                        assert blocks.hashes(size) == chain_hashes(expected, size, parent)
                        apart = PromptBlocks.after(tokens.prefix, tokens.tail, namespace=namespace)
                        assert apart.hashes(size) == chain_hashes(expected, size, parent)
                        assert apart.num_tokens == len(expected) and list(apart.token_ids) == expected
    assert encoder.prefixes is not None and encoder.prefixes.stats.hits == reused
    # Every template here renders a past answer as it rendered it when it completed, so the turn is found unless it
    # had no cut far enough from its end (a first answer of a few characters), or the answer was empty (no key).
    assert reused >= turns // 2, (reused, turns)


def test_an_added_token_longer_than_the_last_segment_moves_the_cut_back() -> None:
    """A remembered text ending ``... x<b>``, where ``x<b>y`` is an added token too: a next turn that continues with
    ``y`` is cut at ``x``, not at ``<b>``. The remembered cut must leave room for the longest added token, or the
    reused ids would be those of ``x`` and ``<b>`` instead of the one token ``x<b>y``."""
    from tokenizers import AddedToken

    tokenizer = bpe_tokenizer(
        ["<|endoftext|>", "<b>", AddedToken("x<b>y", special=True, normalized=False)], template="{{ messages }}"
    )
    encoder = encoder_for(tokenizer)
    remembered = "<b>a<b>hello x<b>"
    encoder.remember(remembered, turn="t")
    assert encoder.prefixes is not None and len(encoder.prefixes) == 1
    prompt = remembered + "y tail<b>more"
    tokens = encoder.encode_cached(prompt, 10**6, "t")
    assert tokens is not None
    assert tokens.ids == whole(tokenizer, prompt)
    assert tokens.prefix is not None and tokens.prefix.cut == len("<b>a")  # the last cut before "x<b>y"'s reach


def test_a_prompt_that_does_not_start_with_the_turn_takes_the_usual_path() -> None:
    tokenizer = qualifying()[0][1]()
    encoder = encoder_for(tokenizer)
    history = [{"role": "user", "content": "the quick brown fox"}, {"role": "assistant", "content": "paged attention"}]
    encoder.remember(render(tokenizer, history, False), turn=turn_key(history))
    edited = [{"role": "user", "content": "the quick brown cat"}, *history[1:], {"role": "user", "content": "KV?"}]
    assert turn_key(edited) == turn_key(history)  # the same key: the text decides
    prompt = render(tokenizer, edited, True)
    tokens = encoder.encode_cached(prompt, 10**6, turn_key(edited))
    assert tokens is not None and tokens.prefix is None
    assert tokens.ids == whole(tokenizer, prompt)
    follow = [*history, {"role": "user", "content": "KV?"}]
    tokens = encoder.encode_cached(render(tokenizer, follow, True), 10**6, turn_key(follow))
    assert tokens is not None and tokens.prefix is not None
    assert tokens.ids == whole(tokenizer, render(tokenizer, follow, True))


def test_turns_are_kept_per_tokenizer() -> None:
    """Two tokenizers with the same template share a store: a prompt is only matched to its own tokenizer's turn."""
    turns = TurnPrefixes(1_000_000)
    cache = TokenCache(1_000_000)
    one = SegmentEncoder.build(qualifying()[0][1](), cache, turns)
    other = SegmentEncoder.build(
        bpe_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], vocab=400), cache, turns
    )
    assert one is not None and other is not None
    one.to_verify = other.to_verify = 0
    history = [{"role": "user", "content": "the quick brown fox"}, {"role": "assistant", "content": "paged attention"}]
    one.remember(render(one.tokenizer, history, False), turn=turn_key(history))
    follow = [*history, {"role": "user", "content": "KV?"}]
    prompt = render(one.tokenizer, follow, True)
    theirs = other.encode_cached(prompt, 10**6, turn_key(follow))
    assert theirs is not None and theirs.prefix is None
    assert theirs.ids == whole(other.tokenizer, prompt)
    ours = one.encode_cached(prompt, 10**6, turn_key(follow))
    assert ours is not None and ours.prefix is not None


def test_the_store_is_a_bounded_lru() -> None:
    turns = TurnPrefixes(10)
    first, second, third = (TurnPrefix(1, i, f"text {i}", 2, list(range(4))) for i in range(3))
    for prefix in (first, second):
        turns.put(prefix)
    assert turns.find(1, 0, "text 0 and more") is first  # now the most recently used
    assert turns.find(1, 0, "text 1 and more") is None  # the key's text is not where this one starts
    turns.put(third)  # 12 tokens: the least recently used goes
    assert len(turns) == 2 and turns.tokens == 8 and turns.stats.evicted == 1
    assert turns.find(1, 1, "text 1 and more") is None
    assert turns.find(1, 0, "text 0 and more") is first
    assert turns.find(2, 0, "text 0 and more") is None  # another tokenizer's
    turns.put(TurnPrefix(1, 9, "long", 1, list(range(11))))  # longer than the bound: not kept
    assert len(turns) == 2


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_a_prompt_kept_apart_hashes_as_the_joined_ids(block_size: int) -> None:
    """``Tokens.after`` / ``PromptBlocks.after``: a remembered turn's ids and the ids after it, never joined for the
    hashes, give the joined list's ids and hashes, whatever the remembered length's remainder modulo the block size
    (the remembered ids past its last full block are hashed with the tail), with and without a namespace."""
    rng = random.Random(block_size)
    for n_known in [0, 1, block_size - 1, block_size, block_size + 1, *rng.sample(range(2, 200), 12)]:
        for n_tail in (0, 1, block_size, rng.randrange(1, 100)):
            known = TurnPrefix(1, ("t", n_known), "x", 0, [rng.randrange(1000) for _ in range(n_known)])
            tail = [rng.randrange(1000) for _ in range(n_tail)]
            joined = known.ids + tail
            tokens = Tokens.after(known, list(tail))
            assert tokens.num_tokens == len(joined) and tokens.tail == tail and tokens.prefix is known
            assert tokens.ids == joined and tokens == Tokens(joined, known)
            assert Tokens(joined, known).tail == tail
            for namespace in (None, "adapter"):
                parent = ROOT if namespace is None else root_hash(namespace)
                blocks = PromptBlocks.after(known, tail, namespace=namespace)
                assert blocks.num_tokens == len(joined) and blocks.num_blocks(block_size) == len(joined) // block_size
                assert blocks.hashes(block_size) == chain_hashes(joined, block_size, parent)
                assert (blocks._ids is None) is (n_known >= block_size)  # joined only without a full known block
                assert list(blocks.token_ids) == joined


def test_block_hashes_are_computed_when_the_turn_is_remembered() -> None:
    tokenizer = qualifying()[0][1]()
    encoder = encoder_for(tokenizer)
    history = [{"role": "user", "content": "the quick brown fox " * 20}, {"role": "assistant", "content": "paged"}]
    encoder.remember(render(tokenizer, history, False), (16, 4), turn_key(history))
    assert encoder.prefixes is not None
    (prefix,) = encoder.prefixes._lru.entries.values()
    assert set(prefix._hashes) == {(16, ROOT), (4, ROOT)}
    assert prefix._hashes[(16, ROOT)] == chain_hashes(prefix.ids, 16)


async def test_the_router_reuses_a_remembered_turn(tiny_model: Path) -> None:
    """Through ``KVRouter``: an answer handed to ``answered`` makes the next turn's prompt start with the remembered
    turn (its hashes reused), with the ids and hashes of a whole tokenization; ``reuse_turns: false`` keeps none."""
    from transformers import AutoTokenizer

    from litellm_disagg.routing.kv.router import KVRouter
    from litellm_disagg.routing.kv.settings import KVRoutingSettings
    from litellm_disagg.routing.pool import WorkerPool
    from litellm_disagg.routing.request import DisaggRequest
    from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole, WorkerState

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    worker = RuntimeConfig(
        worker_id="w0", model="tiny", role=WorkerRole.DECODE, base_url="http://127.0.0.1:1/v1",
        transfer=VllmNixlTransfer(host="127.0.0.1", port=5600), kv_capacity_blocks=100, block_size=16,
        state=WorkerState.READY,
    )  # fmt: skip
    history = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 30}]
    answer = "paged attention keeps the KV cache in blocks " * 5
    follow = [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
    expected = whole(tokenizer, render(tokenizer, follow, True))
    for reuse in (True, False):
        settings = KVRoutingSettings.model_validate(
            {
                "enabled": True,
                "tokenizer": {"model_dirs": {"tiny": str(tiny_model)}, "http_fallback": False, "reuse_turns": reuse},
            }
        )
        router = KVRouter(settings)
        router.sync(WorkerPool.of([worker]))
        for i in range(5):  # a tokenizer's first prompts are checked against whole encoding in a thread
            await router.prompt(DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": [{"role": "user", "content": f"warm {i} <|im_end|> x"}]}, request_id=f"w{i}"), [worker])  # fmt: skip
        first = await router.prompt(DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": history}, request_id="a"), [worker])  # fmt: skip
        assert first is not None
        assert await router.answered("w0", {"messages": history}, answer) >= 1
        second = await router.prompt(DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": follow}, request_id="b"), [worker])  # fmt: skip
        assert second is not None
        assert second.num_tokens == len(expected)
        assert second.hashes(16) == chain_hashes(expected, 16)
        if reuse:  # the remembered ids and the new ones kept apart: no 8k-id join on the request's path
            assert second._ids is None
        assert list(second.token_ids) == expected
        assert (second.known is not None) is reuse
        if reuse:
            assert second.known is not None and (16, ROOT) in second.known._hashes  # computed when remembered
        await router.stop()
