"""PromptTokenizer: local tokenizer and chat template (a tiny one built here), /tokenize fallback (stub HTTP)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.kv.settings import TokenizerSettings
from litellm_disagg.routing.kv.tokenizer import PromptTokenizer, tokenize_body

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<|im_start|>tools\n{{ tools | length }}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<|im_start|>", "<|im_end|>", "<pad>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog " * 20, "paged attention keeps the KV cache in blocks " * 20]
    tok.train_from_iterator(
        corpus,
        trainer=trainers.BpeTrainer(
            vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", pad_token="<pad>")
    fast.chat_template = TEMPLATE
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    fast.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


MESSAGES = [{"role": "system", "content": "the lazy dog"}, {"role": "user", "content": "paged attention"}]


class StubWorker:
    """vLLM's POST /tokenize, recorded; answers with fixed tokens (or a status)."""

    def __init__(self, tokens: list[int] | None = None, status: int = 200) -> None:
        self.tokens = tokens if tokens is not None else [7, 8, 9]
        self.status = status
        self.bodies: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/tokenize"
        self.bodies.append(json.loads(request.content))
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "no"}})
        return httpx.Response(200, json={"count": len(self.tokens), "tokens": self.tokens, "max_model_len": 4096})

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))


def local(model_dir: Path, **kw: Any) -> PromptTokenizer:
    return PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(model_dir)}, **kw))


async def test_chat_uses_the_template_with_a_generation_prompt_and_no_special_tokens(model_dir: Path, hf: Any) -> None:
    tokenizer = local(model_dir)
    ids = await tokenizer.tokenize(model="tiny", endpoint=Endpoint.CHAT, fields={"messages": MESSAGES})
    text = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert ids == hf(text, add_special_tokens=False)["input_ids"]
    assert ids[0] != hf.bos_token_id


@pytest.mark.parametrize(
    ("extra", "render"),
    [
        ({"add_generation_prompt": False}, {"add_generation_prompt": False}),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
        ),
    ],
)
async def test_chat_template_options(model_dir: Path, hf: Any, extra: dict[str, Any], render: dict[str, Any]) -> None:
    ids = await local(model_dir).tokenize(model="tiny", endpoint=Endpoint.CHAT, fields={"messages": MESSAGES, **extra})
    text = hf.apply_chat_template(MESSAGES, tokenize=False, **({"add_generation_prompt": True} | render))
    assert ids == hf(text, add_special_tokens=False)["input_ids"]


async def test_a_client_supplied_chat_template_is_never_rendered(model_dir: Path, monkeypatch: Any) -> None:
    from litellm_disagg.routing.kv import tokenizer as tokenizer_mod

    rendered: list[object] = []
    monkeypatch.setattr(tokenizer_mod, "_encode_locked", lambda *args: rendered.append(args) or [1])
    fields = {"messages": MESSAGES, "chat_template": "{% for x in range(10**9) %}{% endfor %}"}
    assert await local(model_dir).tokenize(model="tiny", endpoint=Endpoint.CHAT, fields=fields) is None
    assert rendered == []  # routed on load alone, nothing rendered


async def test_local_tokenization_is_bounded_by_the_timeout(model_dir: Path, monkeypatch: Any) -> None:
    import threading

    from litellm_disagg.routing.kv import tokenizer as tokenizer_mod

    release = threading.Event()
    monkeypatch.setattr(tokenizer_mod, "_encode_locked", lambda *args: release.wait(30) and [1])
    slow = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(model_dir)}, http_fallback=False, timeout_s=0.05))
    try:
        assert await slow.tokenize(model="tiny", endpoint=Endpoint.CHAT, fields={"messages": MESSAGES}) is None
    finally:
        release.set()


async def test_text_parts_are_joined_with_newlines(model_dir: Path) -> None:
    tokenizer = local(model_dir)
    parts = [{"role": "user", "content": [{"type": "text", "text": "paged"}, {"type": "text", "text": "attention"}]}]
    joined = [{"role": "user", "content": "paged\nattention"}]
    assert await tokenizer.tokenize(
        model="tiny", endpoint=Endpoint.CHAT, fields={"messages": parts}
    ) == await tokenizer.tokenize(model="tiny", endpoint=Endpoint.CHAT, fields={"messages": joined})


async def test_completions_add_special_tokens_like_vllm(model_dir: Path, hf: Any) -> None:
    tokenizer = local(model_dir)
    ids = await tokenizer.tokenize(model="tiny", endpoint=Endpoint.COMPLETIONS, fields={"prompt": "the quick fox"})
    assert ids is not None and ids[0] == hf.bos_token_id
    assert ids == hf("the quick fox")["input_ids"]
    plain = await tokenizer.tokenize(
        model="tiny", endpoint=Endpoint.COMPLETIONS, fields={"prompt": "the quick fox", "add_special_tokens": False}
    )
    assert plain == ids[1:]


async def test_token_prompts_pass_through_and_unsupported_prompts_give_none(model_dir: Path) -> None:
    tokenizer = local(model_dir)
    assert await tokenizer.tokenize(model="tiny", endpoint=Endpoint.COMPLETIONS, fields={"prompt": [5, 6, 7]}) == [
        5,
        6,
        7,
    ]
    assert await tokenizer.tokenize(model="tiny", endpoint=Endpoint.COMPLETIONS, fields={"prompt": ["a", "b"]}) is None
    assert await tokenizer.tokenize(model="tiny", endpoint=Endpoint.CHAT, fields={"messages": []}) is None


async def test_tokenizer_is_loaded_once_and_cached(model_dir: Path) -> None:
    tokenizer = local(model_dir)
    results = await asyncio.gather(
        *(tokenizer.tokenize(model="tiny", endpoint=Endpoint.CHAT, fields={"messages": MESSAGES}) for _ in range(8))
    )
    assert all(r == results[0] and r for r in results)
    assert list(tokenizer._loaded) == ["tiny"]


async def test_remote_fallback_for_a_model_without_a_directory() -> None:
    stub = StubWorker([1, 2, 3])
    tokenizer = PromptTokenizer(TokenizerSettings(), client=stub.client())
    ids = await tokenizer.tokenize(
        model="big",
        endpoint=Endpoint.CHAT,
        fields={"messages": MESSAGES, "tools": [{"x": 1}], "temperature": 0.3},
        worker_url="http://10.0.0.5:8000",
    )
    assert ids == [1, 2, 3]
    assert stub.bodies == [{"model": "big", "messages": MESSAGES, "tools": [{"x": 1}], "add_generation_prompt": True}]
    await tokenizer.tokenize(
        model="big", endpoint=Endpoint.COMPLETIONS, fields={"prompt": "hi", "max_tokens": 3}, worker_url="http://w"
    )
    assert stub.bodies[-1] == {"model": "big", "prompt": "hi"}


async def test_local_failure_falls_back_to_the_worker(model_dir: Path, monkeypatch: Any) -> None:
    stub = StubWorker([4, 4])
    tokenizer = PromptTokenizer(TokenizerSettings(model_dirs={"tiny": str(model_dir)}), client=stub.client())
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]
    assert await tokenizer.tokenize(
        model="tiny", endpoint=Endpoint.CHAT, fields={"messages": image}, worker_url="http://w"
    ) == [4, 4]
    from litellm_disagg.routing.kv import tokenizer as tokenizer_mod

    def broken_template(*args: Any) -> list[int]:
        raise ValueError("the model's template failed")

    monkeypatch.setattr(tokenizer_mod, "_encode_locked", broken_template)
    broken = {"messages": MESSAGES}
    assert await tokenizer.tokenize(model="tiny", endpoint=Endpoint.CHAT, fields=broken, worker_url="http://w") == [
        4,
        4,
    ]
    assert await tokenizer.tokenize(model="tiny", endpoint=Endpoint.CHAT, fields=broken) is None  # no worker to ask


@pytest.mark.parametrize("status", [500, 400, 404])
async def test_remote_errors_give_none(status: int) -> None:
    tokenizer = PromptTokenizer(TokenizerSettings(), client=StubWorker(status=status).client())
    assert (
        await tokenizer.tokenize(
            model="m", endpoint=Endpoint.CHAT, fields={"messages": MESSAGES}, worker_url="http://w"
        )
        is None
    )


async def test_remote_timeout_and_fallback_off() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    tokenizer = PromptTokenizer(TokenizerSettings(), client=httpx.AsyncClient(transport=httpx.MockTransport(hang)))
    assert (
        await tokenizer.tokenize(
            model="m", endpoint=Endpoint.CHAT, fields={"messages": MESSAGES}, worker_url="http://w"
        )
        is None
    )
    stub = StubWorker()
    off = PromptTokenizer(TokenizerSettings(http_fallback=False), client=stub.client())
    assert (
        await off.tokenize(model="m", endpoint=Endpoint.CHAT, fields={"messages": MESSAGES}, worker_url="http://w")
        is None
    )
    assert stub.bodies == []


async def test_a_directory_that_does_not_load_is_not_retried_at_once(tmp_path: Path) -> None:
    stub = StubWorker([3])
    tokenizer = PromptTokenizer(TokenizerSettings(model_dirs={"m": str(tmp_path / "missing")}), client=stub.client())
    for _ in range(2):
        assert await tokenizer.tokenize(
            model="m", endpoint=Endpoint.CHAT, fields={"messages": MESSAGES}, worker_url="http://w"
        ) == [3]
    assert "m" in tokenizer._failed and not tokenizer._loaded


def test_tokenize_body_keeps_only_what_vllm_tokenize_accepts() -> None:
    body = tokenize_body(
        "m",
        Endpoint.CHAT,
        {
            "messages": MESSAGES,
            "add_generation_prompt": False,
            "chat_template_kwargs": {"x": 1},
            "stream": True,
            "max_tokens": 5,
        },
    )
    assert body == {
        "model": "m",
        "messages": MESSAGES,
        "add_generation_prompt": False,
        "chat_template_kwargs": {"x": 1},
    }
