"""One request inside a simulated engine, and the KV a prefill engine holds for a decode engine.

A request's tokens are ``prompt + output``. ``num_computed_tokens`` of them have KV in the request's blocks; the
engine samples the next output token whenever a step brings ``num_computed_tokens`` up to ``num_tokens`` (so a step
that finishes a prompt, and every decode step, yields one token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from litellm_disagg.sim.hashing import BlockHash, extend_hashes
from litellm_disagg.sim.textgen import Model

FinishReason = Literal["stop", "length", "abort"]


class RequestStatus(StrEnum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"
    """Decode side: blocks allocated, KV being pulled from the prefill engine."""
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(frozen=True)
class RemotePrefill:
    """Where a decode request's prompt KV lies (from the ``kv_transfer_params`` of its prefill)."""

    engine_id: str
    request_id: str
    block_ids: tuple[int, ...] | None = None
    host: str | None = None
    port: int | None = None
    push_room: int | None = None
    """SGLang: the prefill engine pushes the KV into this bootstrap room (``engine_id`` is its bootstrap server)."""
    fail_on_error: bool = False
    """When the KV does not arrive: fail the request (SGLang, TensorRT-LLM), not recompute the prompt (vLLM)."""
    vllm_push: bool = False
    """vLLM's push connector: ``request_id`` is unknown up front; the KV comes from the prefill engine's request of
    the same client request id, once that prefill holds its blocks."""


@dataclass
class Lease:
    """Prefill side: the blocks of a finished prefill, held until its decode pulls them or ``expires_at``."""

    request_id: str
    block_ids: list[int]
    token_ids: tuple[int, ...]
    expires_at: float


@dataclass(eq=False)
class SimRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_output_tokens: int
    """How many tokens this request generates in all."""
    limit_reason: FinishReason
    """The finish reason when it has generated ``max_output_tokens`` (``length``: max_tokens or the context's end)."""
    natural_stop_mean: int | None = None
    """Without max_tokens: the model may also stop by itself ("EOS", finish_reason ``stop``), after this many tokens
    on average (``textgen.Model.ends_after_next``); None: it stops only at ``max_output_tokens``."""
    do_remote_decode: bool = False
    """Prefill side of the NIXL protocol: keep the blocks for a decode engine when finished."""
    remote: RemotePrefill | None = None
    """Decode side of the NIXL protocol: pull the prompt's KV from there instead of computing it."""
    push_room: int | None = None
    """Prefill side of SGLang's protocol: when computed, push the KV to the decode registered in this room."""
    rid: str | None = None
    """The client's name for the request (SGLang's ``rid``), by which ``/abort_request`` finds it."""

    status: RequestStatus = RequestStatus.WAITING
    all_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_cached_blocks: int = 0
    """Leading blocks of ``block_ids`` that are in the prefix cache (taken from it or entered into it)."""
    num_local_hit_tokens: int = 0
    num_external_tokens: int = 0
    prompt_stats_done: bool = False
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    model: Model = field(init=False, repr=False)
    """The simulated model's state after ``all_token_ids`` (what it generates next)."""

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        self.all_token_ids = list(self.prompt_token_ids)
        self.model = Model(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_cached_prompt_tokens(self) -> int:
        """Prompt tokens this request did not compute itself (local prefix cache hits plus KV pulled from remote)."""
        return self.num_local_hit_tokens + self.num_external_tokens

    @property
    def done(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        self.model.append(token_id)

    def hashes(self, block_size: int) -> list[BlockHash]:
        """The chained hashes of every full block of ``all_token_ids`` (extended lazily)."""
        extend_hashes(self.block_hashes, self.all_token_ids, block_size)
        return self.block_hashes


def output_budget(
    prompt_len: int,
    *,
    max_tokens: int | None,
    ignore_eos: bool,
    max_model_len: int,
    mean_output_tokens: int,
) -> tuple[int, FinishReason, int | None]:
    """How many tokens a request generates at most, why it stops there, and whether the model may stop earlier.

    With ``max_tokens``: exactly that many (``length``), so benchmarks control output lengths. Without: the rest of
    the context (``length``), and unless ``ignore_eos`` the model stops by itself before that, a deterministic
    function of the context (``natural_stop_mean`` = ``mean_output_tokens``). Never past ``max_model_len``.
    """
    room = max_model_len - prompt_len
    if max_tokens is not None:
        return min(max_tokens, room), "length", None
    return room, "length", None if ignore_eos else mean_output_tokens
