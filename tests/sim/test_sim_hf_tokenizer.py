"""A proxy can tokenize for simulated workers itself (``python:`` tokenizer factory): same ids as their /tokenize."""

from __future__ import annotations

from pathlib import Path

import httpx

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.routing.kv.settings import TokenizerSettings
from litellm_disagg.routing.kv.tokenizer import PromptTokenizer
from litellm_disagg.sim import SimCluster
from litellm_disagg.engines.base import Endpoint

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
