"""Chained block hashes: full blocks only, prefix property, event-side rebuild equals request-side."""

from __future__ import annotations

import random

import pytest

from litellm_disagg.routing.kv.block_hash import ROOT, PromptBlocks, chain_hashes, root_hash


def tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 150_000) for _ in range(n)]


@pytest.mark.parametrize(
    ("n_tokens", "block_size", "blocks"),
    [(0, 16, 0), (15, 16, 0), (16, 16, 1), (17, 16, 1), (8192, 16, 512), (100, 32, 3), (5, 1, 5)],
)
def test_only_full_blocks_are_hashed(n_tokens: int, block_size: int, blocks: int) -> None:
    assert len(chain_hashes(tokens(n_tokens), block_size)) == blocks


def test_equal_prefixes_share_hashes_until_they_differ() -> None:
    a = tokens(64)
    b = a[:40] + [7] * 24  # differs inside the third block
    ha, hb = chain_hashes(a, 16), chain_hashes(b, 16)
    assert ha[:2] == hb[:2]
    assert ha[2] != hb[2] and ha[3] != hb[3]  # the chain carries the difference into every later block


def test_a_block_hash_covers_its_whole_prefix() -> None:
    a, b = tokens(32, seed=1), tokens(32, seed=2)
    same_second_block = b[:16] + a[16:]
    assert chain_hashes(a, 16)[1] != chain_hashes(same_second_block, 16)[1]


def test_deterministic_and_input_type_agnostic() -> None:
    t = tokens(100)
    assert chain_hashes(t, 16) == chain_hashes(tuple(t), 16) == chain_hashes(t, 16)


def test_event_rebuild_from_parent_equals_request_hashes() -> None:
    """A BlockStored that continues a cached prefix carries only the new blocks' tokens and the parent's hash."""
    t = tokens(16 * 7)
    whole = chain_hashes(t, 16)
    first = chain_hashes(t[: 16 * 3], 16)
    rest = chain_hashes(t[16 * 3 :], 16, parent=first[-1])
    assert first + rest == whole


def test_namespaces_separate_chains() -> None:
    t = tokens(32)
    assert chain_hashes(t, 16, root_hash("adapter-a")) != chain_hashes(t, 16, ROOT)
    assert root_hash("adapter-a") == root_hash("adapter-a") != root_hash("adapter-b")
    assert root_hash(None) == ROOT


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        chain_hashes([1, 2, 3], 0)


def test_prompt_blocks_caches_per_block_size() -> None:
    t = tokens(70)
    prompt = PromptBlocks(t)
    assert prompt.num_tokens == 70 and prompt.num_blocks(16) == 4
    assert prompt.hashes(16) is prompt.hashes(16)
    assert prompt.hashes(32) == chain_hashes(t, 32)
    assert PromptBlocks(t, namespace="x").hashes(16) == chain_hashes(t, 16, root_hash("x"))


def reference_chain(token_ids: list[int], block_size: int, parent: int = ROOT) -> list[int]:
    """The definition, spelled out: each full block's hash is ``hash((parent's hash, tuple of its tokens))``."""
    t = tuple(token_ids)
    out, h = [], parent
    for start in range(0, len(t) - block_size + 1, block_size):
        h = hash((h, t[start : start + block_size]))
        out.append(h)
    return out


@pytest.mark.parametrize("n_tokens", [0, 1, 15, 16, 17, 100, 8192 + 7])
@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
def test_hash_values_match_the_definition(n_tokens: int, block_size: int) -> None:
    t = tokens(n_tokens, seed=n_tokens)
    expected = reference_chain(t, block_size)
    assert chain_hashes(t, block_size) == chain_hashes(tuple(t), block_size) == expected
    assert chain_hashes(t, block_size, root_hash("ns")) == reference_chain(t, block_size, root_hash("ns"))
    assert PromptBlocks(t).hashes(block_size) == expected
    assert PromptBlocks(iter(t)).hashes(block_size) == expected  # type: ignore[arg-type]  # any iterable of ids


def test_prompt_blocks_keeps_the_given_list() -> None:
    t = tokens(40)
    prompt = PromptBlocks(t)
    assert prompt.token_ids is t and prompt.num_tokens == 40
    generated = PromptBlocks(x for x in t)  # type: ignore[arg-type]
    assert generated.token_ids == tuple(t) and generated.num_tokens == 40
