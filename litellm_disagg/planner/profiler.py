"""Measure an engine profile (``mixing.EngineProfile``) on a live worker, through its OpenAI API.

    await measure_profile(client, ProfileTarget(...), ProfilePlan(...)) -> ProfileFit     (``profile_fit.py``)
    litellm-disagg profile --url http://127.0.0.1:8100 --max-num-batched-tokens 2048      (the command)

The planner's ``aggregation_pays`` needs four numbers about the engine (``planner.engine_profile``). This measures
them on a worker as it runs, with the engine's own scheduler, so the operator does not need the engine's benchmark
tools or its launch flags:

- **Decode steps**: for each batch size ``b`` of ``plan.batches``, ``b`` streamed completions of a short prompt sent
  together, each ``plan.output_tokens`` long (``ignore_eos``). Their prompts are computed in the first step or two;
  after that every step decodes the ``b`` of them, so a request's time per output token after its first (TPOT) is
  the step time at batch ``b``. The point is the median over the ``b`` requests, and over ``plan.repeats``.
- **Prefill**: a non-streamed completion of one output token for a new prompt (random words: no prefix-cache hit)
  at each length of ``plan.prompt_tokens``, ``plan.repeats`` times each, one at a time. Its time against its length
  (``usage.prompt_tokens``, as the engine counted it) gives the compute-bound rate (``profile_fit.py``).

The worker must be otherwise idle (other requests in its steps are counted as its own cost): profile a worker before
it joins the pool, or one drained for the purpose. Every request is a plain completion (no ``kv_transfer_params``),
which any worker serves whatever its role. The step budget cannot be read from the API: it is the workers' own
``--max-num-batched-tokens`` (``plan.max_num_batched_tokens``).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field

from litellm_disagg.planner.mixing import EngineProfile
from litellm_disagg.planner.profile_fit import DecodePoint, PrefillPoint, ProfileFit, fit_profile


class ProfileError(RuntimeError):
    """The worker did not answer as a profiling run needs (an HTTP error, an answer without usage)."""


class ProfilePlan(BaseModel):
    """What to measure (the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_batched_tokens: Annotated[int, Field(ge=1)]
    batches: Annotated[tuple[Annotated[int, Field(ge=1)], ...], Field(min_length=2)] = (1, 2, 4, 8, 16)
    output_tokens: Annotated[int, Field(ge=3)] = 48
    """Tokens each decode request generates (more: the step time averages over more steps)."""
    prompt_tokens: Annotated[tuple[Annotated[int, Field(ge=1)], ...], Field(min_length=2)] | None = None
    """Prompt lengths for the prefill points (two or more); None: a quarter and three quarters of the model's
    context (``max_model_len`` from ``/v1/models``), at most 8,192 tokens."""
    repeats: Annotated[int, Field(ge=1)] = 3
    decode_prompt_words: Annotated[int, Field(ge=1)] = 8
    seed: int | None = None
    """The prompts' random words (None: fresh ones every run, so a second run on the same worker meets no prefix
    the first one left in its cache)."""


@dataclass(frozen=True)
class ProfileTarget:
    """The worker's OpenAI API (``base_url`` ends in ``/v1``) and the model it serves (None: its first)."""

    base_url: str
    model: str | None = None
    api_key: str | None = None

    @classmethod
    def of(cls, url: str, model: str | None = None, api_key: str | None = None) -> ProfileTarget:
        """``url`` with or without the ``/v1`` suffix."""
        base = url.rstrip("/")
        return cls(base if base.endswith("/v1") else base + "/v1", model, api_key)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class ServedModel:
    name: str
    max_model_len: int | None


async def served_model(client: httpx.AsyncClient, target: ProfileTarget) -> ServedModel:
    """The model to profile (``target.model``, else the worker's first) and its context length, if the worker says."""
    r = await client.get(f"{target.base_url}/models", headers=target.headers)
    _check(r)
    cards = [c for c in r.json().get("data", []) if isinstance(c, dict) and isinstance(c.get("id"), str)]
    if target.model is not None:
        cards = [c for c in cards if c["id"] == target.model] or [{"id": target.model}]
    if not cards:
        raise ProfileError(f"{target.base_url}/models lists no model")
    card = cards[0]
    length = card.get("max_model_len")
    return ServedModel(card["id"], length if isinstance(length, int) and length > 0 else None)


def _check(r: httpx.Response) -> None:
    if r.status_code >= 400:
        raise ProfileError(f"{r.request.method} {r.request.url} answered {r.status_code}: {r.text[:300]}")


class Words:
    """Random lowercase words: every prompt is new to the engine's prefix cache."""

    def __init__(self, seed: int | None) -> None:
        self._rng = random.Random(seed)

    def text(self, words: int) -> str:
        return " ".join(self.words(words))

    def words(self, count: int) -> list[str]:
        letters = "abcdefghijklmnopqrstuvwxyz"
        return ["".join(self._rng.choices(letters, k=self._rng.randint(3, 8))) for _ in range(count)]


async def _complete(client: httpx.AsyncClient, target: ProfileTarget, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(f"{target.base_url}/completions", json=body, headers=target.headers)
    _check(r)
    answer = r.json()
    if not isinstance(answer.get("usage"), dict):
        raise ProfileError("a completion came back without usage")
    return answer


@dataclass(frozen=True)
class StreamedAnswer:
    """One streamed completion as measured: its time per output token after its first (TPOT, ms; None: fewer than 2
    tokens), and the tokens the engine counted (``usage``; None when the stream carried none)."""

    tpot_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None


async def streamed(client: httpx.AsyncClient, target: ProfileTarget, body: dict[str, Any]) -> StreamedAnswer:
    """Send one streamed completion (``body`` with ``stream`` and ``stream_options.include_usage``) and time it."""
    first: float | None = None
    last: float | None = None
    prompt: int | None = None
    tokens: int | None = None
    chunks = 0
    async with client.stream("POST", f"{target.base_url}/completions", json=body, headers=target.headers) as r:
        if r.status_code >= 400:
            await r.aread()
            _check(r)
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if any(c.get("text") for c in event.get("choices") or []):
                now = time.perf_counter()
                first = now if first is None else first
                last = now
                chunks += 1
            usage = event.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                tokens = usage["completion_tokens"]
                prompt = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    count = tokens if tokens is not None else chunks
    if first is None or last is None or count < 2 or last <= first:
        return StreamedAnswer(None, prompt, tokens)
    return StreamedAnswer((last - first) * 1000.0 / (count - 1), prompt, tokens)


async def _tpot_ms(client: httpx.AsyncClient, target: ProfileTarget, body: dict[str, Any]) -> float | None:
    """One streamed completion's time per output token after its first, in ms (None: fewer than 2 tokens)."""
    return (await streamed(client, target, body)).tpot_ms


async def measure_decode(client: httpx.AsyncClient, target: ProfileTarget, model: str, plan: ProfilePlan,
                         words: Words) -> list[DecodePoint]:
    points: list[DecodePoint] = []
    for batch in plan.batches:
        per_repeat: list[float] = []
        for _ in range(plan.repeats):
            bodies = [{"model": model, "prompt": words.text(plan.decode_prompt_words), "max_tokens": plan.output_tokens,
                       "ignore_eos": True, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}} for _ in range(batch)]
            tpots = [t for t in await asyncio.gather(*(_tpot_ms(client, target, b) for b in bodies)) if t is not None]
            if not tpots:
                raise ProfileError(f"no request of batch {batch} streamed two or more tokens")
            per_repeat.append(statistics.median(tpots))
        points.append(DecodePoint(batch, statistics.median(per_repeat)))
    return points


async def measure_prefill(client: httpx.AsyncClient, target: ProfileTarget, served: ServedModel, plan: ProfilePlan,
                          words: Words) -> list[PrefillPoint]:
    lengths = plan.prompt_tokens or default_prompt_tokens(served.max_model_len)
    per_word = await tokens_per_word(client, target, served.name, words)
    limit = None if served.max_model_len is None else served.max_model_len - 8
    points: list[PrefillPoint] = []
    for length in lengths:
        times: list[float] = []
        counted: list[int] = []
        for _ in range(plan.repeats):
            want = length if limit is None else min(length, int(limit * 0.95))
            prompt = await sized_prompt(client, target, served.name, words, max(1, want), per_word)
            body = {"model": served.name, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            start = time.perf_counter()
            answer = await _complete(client, target, body)
            times.append(time.perf_counter() - start)
            counted.append(int(answer["usage"]["prompt_tokens"]))
        points.append(PrefillPoint(int(statistics.median(counted)), statistics.median(times)))
    return points


async def tokens_per_word(client: httpx.AsyncClient, target: ProfileTarget, model: str, words: Words) -> float:
    """How many tokens a random word makes with the worker's tokenizer (the engine counts them: usage)."""
    probe = await _complete(client, target, {"model": model, "prompt": words.text(200), "max_tokens": 1})
    return max(0.1, probe["usage"]["prompt_tokens"] / 200)


async def count_tokens(client: httpx.AsyncClient, target: ProfileTarget, model: str, text: str) -> int | None:
    """The prompt's tokens as the worker counts them (``POST /tokenize``, vLLM's API, beside ``/v1``); None where the
    worker has no such endpoint or it fails."""
    try:
        r = await client.post(f"{target.base_url.removesuffix('/v1')}/tokenize", json={"model": model, "prompt": text},
                              headers=target.headers)
    except httpx.HTTPError:
        return None
    if r.status_code >= 400:
        return None
    try:
        count = r.json().get("count")
    except ValueError:
        return None
    return count if isinstance(count, int) and count > 0 else None


async def sized_prompt(client: httpx.AsyncClient, target: ProfileTarget, model: str, words: Words, tokens: int,
                       per_word: float) -> str:
    """Random words that make about ``tokens`` tokens. Sized first from the calibrated tokens per word (a 40-word
    prompt's own words can stray a quarter from a 200-word average: a CI run asked for 128 and got 99), then, where
    the worker answers ``/tokenize``, the word count rescaled on what these words count (at least a word each time),
    at most four times, over prefixes of one list of words (a longer prefix never counts fewer tokens); the closest
    prefix counted wins."""
    first = max(1, int(tokens / per_word))
    pool = words.words(2 * first + 8)
    take, best, best_miss = first, first, None
    for _ in range(4):
        counted = await count_tokens(client, target, model, " ".join(pool[:take]))
        if counted is None:
            break
        miss = abs(counted - tokens)
        if best_miss is None or miss < best_miss:
            best, best_miss = take, miss
        if miss <= max(2, tokens // 50):
            break
        scaled = round(take * tokens / counted)
        step = scaled - take if scaled != take else (1 if counted < tokens else -1)
        take = max(1, min(len(pool), take + step))
    return " ".join(pool[:best])


def default_prompt_tokens(max_model_len: int | None) -> tuple[int, ...]:
    """A quarter and three quarters of the context, at most 8,192 tokens (2,048 when the context is not known)."""
    top = min(8192, max_model_len if max_model_len is not None else 2048)
    return (max(16, top // 4), max(32, 3 * top // 4))


async def measure_profile(client: httpx.AsyncClient, target: ProfileTarget, plan: ProfilePlan) -> ProfileFit:
    """Measure and fit (the module docstring). One warm-up request first (an engine's first step may compile)."""
    served = await served_model(client, target)
    words = Words(plan.seed)
    await _complete(client, target, {"model": served.name, "prompt": words.text(16), "max_tokens": 4})
    decode = await measure_decode(client, target, served.name, plan, words)
    prefill = await measure_prefill(client, target, served, plan, words)
    return fit_profile(decode, prefill, plan.max_num_batched_tokens)


def render_yaml(fit: ProfileFit) -> str:
    """The ``engine_profile`` block for ``proxy_config.yaml`` (under ``litellm_disagg.planner``)."""
    return render_profile_yaml(fit.profile)


def render_profile_yaml(profile: EngineProfile) -> str:
    lines = ["engine_profile:"]
    for name, value in profile.model_dump().items():
        lines.append(f"  {name}: {round(value, 4) if isinstance(value, float) else value}")
    return "\n".join(lines) + "\n"


def load_profile(text: str) -> EngineProfile:
    """An ``engine_profile`` from YAML: the block this command prints (top-level ``engine_profile``) or a whole
    ``proxy_config.yaml`` (``litellm_disagg.planner.engine_profile``). ValueError when neither holds one."""
    data = yaml.safe_load(text)
    block = data.get("engine_profile") if isinstance(data, dict) else None
    if block is None and isinstance(data, dict):
        planner = (data.get("litellm_disagg") or {}).get("planner") if isinstance(data.get("litellm_disagg"), dict) \
            else None
        block = planner.get("engine_profile") if isinstance(planner, dict) else None
    if not isinstance(block, dict):
        raise ValueError("no engine_profile in the file (top level, or under litellm_disagg.planner)")
    return EngineProfile.model_validate(block)


def render_points(fit: ProfileFit) -> str:
    """The measured points beside the fitted lines, for an operator to judge the fit."""
    out = [f"decode: step ms = {fit.decode.intercept:.3f} + {fit.decode.slope:.4f} x batch  (R2 {fit.decode.r2:.3f})"]
    out += [f"  batch {p.batch:>4}: {p.step_ms:8.3f} ms measured, {fit.predicted_step_ms(p.batch):8.3f} fitted"
            for p in fit.decode_points]
    rate = fit.profile.prefill_tokens_per_s
    out.append(f"prefill: {rate:,.0f} tokens/s, fixed {fit.prefill.intercept * 1000:.1f} ms  (R2 {fit.prefill.r2:.3f})")
    out += [f"  {p.prompt_tokens:>6} tokens: {p.seconds * 1000:9.1f} ms" for p in fit.prefill_points]
    return "\n".join(out) + "\n"


def parse_sizes(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4)."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise ValueError(f"not a comma-separated list of integers: {text!r}") from exc
    if not sizes:
        raise ValueError("an empty list")
    return sizes


def plan_from(max_num_batched_tokens: int, batches: Sequence[int] | None, output_tokens: int | None,
              prompt_tokens: Sequence[int] | None, repeats: int | None) -> ProfilePlan:
    fields: dict[str, Any] = {"max_num_batched_tokens": max_num_batched_tokens}
    if batches is not None:
        fields["batches"] = tuple(batches)
    if output_tokens is not None:
        fields["output_tokens"] = output_tokens
    if prompt_tokens is not None:
        fields["prompt_tokens"] = tuple(prompt_tokens)
    if repeats is not None:
        fields["repeats"] = repeats
    return ProfilePlan.model_validate(fields)
