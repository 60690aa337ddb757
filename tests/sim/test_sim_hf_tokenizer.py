"""A proxy can tokenize for simulated workers itself (``python:`` tokenizer factory): same ids as their /tokenize."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.kv.settings import TokenizerSettings
from litellm_disagg.routing.kv.tokenizer import PromptTokenizer
from litellm_disagg.sim import SimCluster, hf_tokenizer
from litellm_disagg.sim import tokenizer as sim_tokenizer

from .conftest import fast_settings

FACTORY = "python:litellm_disagg.sim.hf_tokenizer:load"

CHAT = {
    "messages": [
        {"role": "system", "content": "You answer in pseudo-words. kalo mibe"},
        {"role": "user", "content": "What is the question, exactly?"},
        {"role": "assistant", "content": " kalo mibe tuna"},
        {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "text", "text": "again?"}]},
    ]
}


async def test_the_factory_tokenizes_like_the_simulated_worker(tmp_path: Path) -> None:
    settings = fast_settings()
    local = PromptTokenizer(TokenizerSettings(model_dirs={settings.model: FACTORY}, http_fallback=False))
    async with SimCluster(registry=FileRegistry(tmp_path), settings=settings) as cluster, httpx.AsyncClient() as client:
        [worker] = await cluster.start(both=1)
        for endpoint, fields in (
            (Endpoint.CHAT, CHAT),
            (Endpoint.CHAT, {**CHAT, "add_generation_prompt": False, "continue_final_message": True}),
            (Endpoint.COMPLETIONS, {"prompt": "<|im_start|>user\nplain text, kalo<|im_end|>"}),
        ):
            ours = await local.tokenize(model=settings.model, endpoint=endpoint, fields=fields)
            body = {"model": settings.model, **fields}
            theirs = (await client.post(f"{worker.server_url}/tokenize", json=body)).json()["tokens"]
            assert ours == theirs and ours
    await local.aclose()


async def test_a_bad_factory_spec_falls_back_to_the_worker(tmp_path: Path) -> None:
    settings = fast_settings()
    broken = PromptTokenizer(TokenizerSettings(model_dirs={settings.model: "python:no_such_module_here:load"}))
    async with SimCluster(registry=FileRegistry(tmp_path), settings=settings) as cluster:
        [worker] = await cluster.start(both=1)
        tokens = await broken.tokenize(
            model=settings.model, endpoint=Endpoint.CHAT, fields=CHAT, worker_url=worker.server_url
        )
        assert tokens  # from the worker's /tokenize
    await broken.aclose()


LONG = " ".join(["kalo mibe tuna"] * 50)  # a system prompt long enough to be cached (MIN_CACHED_CHARS)


def test_a_next_turn_encodes_only_its_new_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    # A conversation resends its history every turn: the proxy's encoding of the next turn reuses the parts it has
    # encoded before (same ids as the whole encoding) and encodes only the text it has not seen.
    tok = hf_tokenizer.load()
    encoded: list[str] = []
    plain = sim_tokenizer.encode_plain
    monkeypatch.setattr(sim_tokenizer, "encode_plain", lambda part: encoded.append(part) or plain(part))
    turn1 = [{"role": "system", "content": LONG}, {"role": "user", "content": "first question " * 8}]
    turn2 = [*turn1, {"role": "assistant", "content": " kalo mibe"}, {"role": "user", "content": "second one " * 8}]
    for messages in (turn1, turn2):
        text = tok.apply_chat_template(messages, tokenize=False)
        assert tok(text)["input_ids"] == sim_tokenizer.encode(text)
    text = tok.apply_chat_template(turn2, tokenize=False)
    whole = sim_tokenizer.encode(text)
    encoded.clear()
    assert tok(text)["input_ids"] == whole
    assert not [part for part in encoded if LONG in part]  # the system prompt is not encoded again...
    assert tok.parts.hits >= 1


def test_the_part_cache_is_bounded_and_exact() -> None:
    cache = hf_tokenizer.PartCache(max_tokens=300)
    parts = [f"part {i} " + "kalo mibe tuna " * 40 for i in range(5)]  # about 122 tokens each
    for part in parts * 2:
        assert list(cache.ids(part)) == sim_tokenizer.encode_plain(part)
    assert cache.tokens <= 300 and len(cache) == 2  # the two most recent parts
    assert list(cache.ids(parts[-1])) == sim_tokenizer.encode_plain(parts[-1]) and cache.hits >= 1
    huge = "kalo " * 400
    assert list(cache.ids(huge)) == sim_tokenizer.encode_plain(huge)  # longer than the bound: encoded, not cached
    assert len(cache) == 2


async def test_the_router_encodes_a_mostly_cached_next_turn_on_the_event_loop() -> None:
    # The thread hand-off costs more than a next turn whose parts are cached (and its GIL hold stalls the event loop):
    # the router asks the simulator's tokenizer for its cached encoding first, as it does a segment cache.
    local = PromptTokenizer(TokenizerSettings(model_dirs={"m": FACTORY}, http_fallback=False))
    system = " ".join(["kalo mibe tuna"] * 400)  # longer than inline_max_new_chars (4,096)
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "first question " * 8}]
    turn2 = [*turn1, {"role": "assistant", "content": " kalo mibe"}, {"role": "user", "content": "second one " * 8}]
    tok = hf_tokenizer.load()
    for messages, inline in ((turn1, 0), (turn2, 1)):
        ids = await local.tokenize(model="m", endpoint=Endpoint.CHAT, fields={"messages": messages})
        assert ids == sim_tokenizer.encode(tok.apply_chat_template(messages, tokenize=False))
        assert local.inline_encodes == inline  # the first turn's system prompt is new: in a thread
    await local.aclose()
