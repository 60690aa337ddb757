"""vLLM's NixlConnector transfer, pull mode: ``VllmNixlProtocol`` and its handle, ``KVTransferParams``.

The protocol (vLLM v1 ``NixlConnector``), sequential (``concurrent = False``):

1. The prefill request is the client's request with ``max_tokens=1`` (and ``max_completion_tokens=1`` where given),
   ``stream=false``, no ``stream_options``/``min_tokens``/``n``, and ``kv_transfer_params={"do_remote_decode": true}``.
2. The prefill response carries ``kv_transfer_params`` (``do_remote_prefill``, ``remote_block_ids``,
   ``remote_engine_id``, ``remote_request_id``, ``remote_host``, ``remote_port``, ``tp_size``, ...).
3. The decode request is the client's request unchanged, plus those ``kv_transfer_params`` verbatim at the top level;
   the decode worker then pulls the blocks from the prefill worker over NIXL.

A prefill worker's answer is a claim, like its discovery entry: before it reaches a decode worker it is checked
(``check_origin``, on every parse) against what discovery says about the worker that answered, and bounded:

- only the keys vLLM's NixlConnector writes (``KNOWN_KEYS``), each of its type (no bool for an int), strings and
  lists of bounded length;
- ``remote_engine_id`` is the engine id the worker published (``VllmNixlTransfer.engine_id``; vLLM's ``_dp<rank>``
  suffix allowed), ``remote_host``/``remote_port`` are its published NIXL side channel: a worker can only hand out
  its own blocks, never name another engine's;
- ``remote_block_ids``: at most ``ceil(prompt tokens / block size) + 1`` non-negative ids per KV group (the prompt
  as the router counted it when it tokenized, else as the answer's ``usage`` says, else the worker's capacity), each
  below the published capacity when known; ``remote_num_tokens`` at most the prompt plus one.

What fails is ``InvalidTransfer``: a failed prefill (the next worker, then aggregated), logged, never forwarded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from litellm_disagg.engines.base import Endpoint, InvalidTransfer, TransferHandle
from litellm_disagg.engines.openai_fields import prefill_fields
from litellm_disagg.runtime_config import RuntimeConfig

PARAMS_KEY: Final = "kv_transfer_params"
PREFILL_MARKER: Final[Mapping[str, Any]] = MappingProxyType({"do_remote_decode": True})
"""What the prefill request carries under ``kv_transfer_params`` (copied into each body, never shared)."""
RELEASE_PATH: Final = "v1/completions"
RELEASE_MODEL: Final = "litellm-disagg/release-unread-kv"
"""A model name no worker serves: the release request is refused before the engine (``release_unread``)."""

MAX_KV_GROUPS: Final = 16
"""KV cache groups one answer may name (one for ordinary models; hybrid models have a few)."""
MAX_BLOCKS_UNBOUNDED: Final = 1 << 20
"""Block ids per group when neither the prompt's length nor the worker's capacity is known."""

_Id = Annotated[StrictStr, Field(min_length=1, max_length=256)]
_Count = Annotated[StrictInt, Field(ge=1, le=4096)]
_BlockId = Annotated[StrictInt, Field(ge=0, lt=1 << 40)]
_Blocks = Annotated[list[_BlockId], Field(max_length=MAX_BLOCKS_UNBOUNDED)]


class KVTransferParams(BaseModel, TransferHandle):
    """What a vLLM prefill returns for its decode: only the keys vLLM's NixlConnector writes, each typed and bounded;
    passed on verbatim (the keys that were set, as they were)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    protocol: ClassVar[str] = "vllm-nixl"

    do_remote_prefill: StrictBool = False
    do_remote_decode: StrictBool = False
    remote_engine_id: _Id | None = None
    remote_request_id: _Id | None = None
    remote_block_ids: Annotated[list[_Blocks], Field(max_length=MAX_KV_GROUPS)] | _Blocks | None = None
    """One list per KV cache group (vLLM 0.10+), or one flat list (older releases)."""
    remote_host: Annotated[StrictStr, Field(min_length=1, max_length=255)] | None = None
    remote_port: Annotated[StrictInt, Field(ge=1, le=65535)] | None = None
    tp_size: _Count | None = None
    dcp_size: _Count | None = None
    pp_size: _Count | None = None
    remote_num_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    remote_blocks_expiry_time: StrictFloat | StrictInt | None = None
    remote_block_size: _Count | None = None
    transfer_mode: Annotated[StrictStr, Field(max_length=32)] | None = None
    remote_prefill_cached_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    """Added by vLLM 0.32's scheduler (``_free_request``) when the prefill had prefix-cache hits."""

    def for_decode(self) -> dict[str, Any]:
        """The dict to send as the decode request's top-level ``kv_transfer_params``, exactly as received."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def usable(self) -> bool:
        """True when the decode worker can pull this prompt's KV (the prefill computed and kept it)."""
        return self.do_remote_prefill and bool(self.remote_engine_id)

    def block_groups(self) -> list[list[int]]:
        ids = self.remote_block_ids or []
        if ids and isinstance(ids[0], list):
            return ids  # type: ignore[return-value]
        return [ids] if ids else []  # type: ignore[list-item]


KNOWN_KEYS: Final = frozenset(KVTransferParams.model_fields)
"""The keys a prefill answer's ``kv_transfer_params`` may carry (what vLLM's NixlConnector writes)."""


def check_origin(params: KVTransferParams, prefill: RuntimeConfig, *, prompt_tokens: int | None) -> None:
    """Raise ``InvalidTransfer`` unless ``params`` name ``prefill``'s own engine and side channel as published in
    discovery, and their blocks fit the prompt (``prompt_tokens``: the prompt's length in tokens, when known)."""
    transfer = prefill.transfer
    host, port = getattr(transfer, "host", None), getattr(transfer, "port", None)
    published_engine = getattr(transfer, "engine_id", None)
    if not transfer.kind.startswith("vllm-nixl") or host is None or port is None:
        raise InvalidTransfer(f"worker {prefill.worker_id} publishes no NIXL side channel")
    if params.do_remote_decode:
        raise InvalidTransfer("do_remote_decode set in a prefill's answer")
    if published_engine is not None and not _same_engine(params.remote_engine_id, published_engine):
        raise InvalidTransfer(
            f"remote_engine_id {params.remote_engine_id!r} is not the engine {prefill.worker_id} published"
        )
    if params.remote_host != host or params.remote_port != port:
        raise InvalidTransfer(
            f"side channel {params.remote_host}:{params.remote_port} is not the one {prefill.worker_id} published"
            f" ({host}:{port})"
        )
    capacity = prefill.kv_capacity_blocks
    if prompt_tokens is not None:
        limit = math.ceil(prompt_tokens / prefill.block_size) + 1
    else:
        limit = capacity or MAX_BLOCKS_UNBOUNDED
    for group in params.block_groups():
        if len(group) > limit:
            raise InvalidTransfer(f"{len(group)} block ids for a prompt that fills at most {limit} blocks")
        if capacity and any(block >= capacity for block in group):
            raise InvalidTransfer(f"a block id beyond the {capacity} blocks {prefill.worker_id} published")
    if prompt_tokens is not None and params.remote_num_tokens is not None and params.remote_num_tokens > prompt_tokens + 1:
        raise InvalidTransfer(f"remote_num_tokens {params.remote_num_tokens} for a prompt of {prompt_tokens} tokens")


def _same_engine(answered: str | None, published: str) -> bool:
    # vLLM appends "_dp<rank>" to the configured engine id when data parallelism is on.
    return answered == published or (
        answered is not None and answered.startswith(f"{published}_dp") and _DP_SUFFIX.fullmatch(answered[len(published):]) is not None
    )


_DP_SUFFIX: Final = re.compile(r"_dp\d{1,4}")


def build_prefill_body(endpoint: Endpoint, model: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill request for ``request`` (the client's OpenAI fields), addressed to ``model`` on the worker."""
    body: dict[str, Any] = prefill_fields(endpoint, request, sampling=False)
    body["model"] = model
    body["max_tokens"] = 1
    if endpoint is Endpoint.CHAT and request.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = 1
    body["stream"] = False
    body[PARAMS_KEY] = dict(PREFILL_MARKER)
    return body


def parse_transfer_params(
    payload: Any, *, prefill: RuntimeConfig | None = None, prompt_tokens: int | None = None
) -> KVTransferParams:
    """The usable ``kv_transfer_params`` of a prefill's JSON response. With ``prefill`` (the worker that answered),
    also checked against its discovery entry (``check_origin``). Raises ``InvalidTransfer``."""
    raw = payload.get(PARAMS_KEY) if isinstance(payload, dict) else None
    if raw is None:
        raise InvalidTransfer(f"the response has no {PARAMS_KEY}")
    if isinstance(raw, dict) and (unknown := sorted(str(k)[:64] for k in raw if k not in KNOWN_KEYS)):
        raise InvalidTransfer(f"{PARAMS_KEY} with unknown keys {unknown[:8]}")
    try:
        params = KVTransferParams.model_validate(raw)
    except ValidationError as exc:
        raise InvalidTransfer(f"invalid {PARAMS_KEY}: {exc.error_count()} error(s), first: {_first_error(exc)}") from exc
    if not params.usable:
        raise InvalidTransfer(f"{PARAMS_KEY} without a remote prefill (do_remote_prefill, remote_engine_id)")
    if prefill is not None:
        if prompt_tokens is None:
            prompt_tokens = _usage_prompt_tokens(payload)
        check_origin(params, prefill, prompt_tokens=prompt_tokens)
    return params


def _usage_prompt_tokens(payload: Mapping[str, Any]) -> int | None:
    usage = payload.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors(include_url=False, include_input=False)[0]
    return f"{'.'.join(str(p) for p in error['loc'])[:80]}: {error['msg'][:120]}"


class VllmNixlProtocol:
    """``TransferProtocol`` of vLLM's NixlConnector (pull). Stateless."""

    name = "vllm-nixl"
    concurrent = False
    decode_serves_alone = True  # a kv_consumer computes a prompt that comes without kv_transfer_params
    client_keys: tuple[str, ...] = (PARAMS_KEY,)

    def open_transfer(self, *, prefill: RuntimeConfig, decode: RuntimeConfig, request_id: str) -> None:
        return None  # sequential: the decode's fields come from the prefill's answer

    def prefill_body(
        self,
        endpoint: Endpoint,
        served_model: str,
        fields: Mapping[str, Any],
        *,
        prefill: RuntimeConfig,
        decode: RuntimeConfig,
        handle: TransferHandle | None = None,
    ) -> dict[str, Any]:
        return build_prefill_body(endpoint, served_model, fields)

    def parse_prefill(
        self,
        payload: Any,
        *,
        prefill: RuntimeConfig,
        handle: TransferHandle | None = None,
        prompt_tokens: int | None = None,
    ) -> KVTransferParams:
        return parse_transfer_params(payload, prefill=prefill, prompt_tokens=prompt_tokens)

    def abort_decode(self, handle: TransferHandle) -> None:
        return None  # sequential: no decode is waiting when a prefill fails

    def release_unread(self, handle: TransferHandle) -> tuple[str, dict[str, Any]]:
        """The request that makes a decode worker tell the prefill worker to free ``handle``'s blocks unread
        (``routing/kv_release.py``). vLLM's serving layer, when it refuses a request that carries
        ``kv_transfer_params`` before its engine runs it (here: a model it does not serve, a 404), submits it to the
        engine pre-aborted (``notify_kv_transfer_request_rejected``); the NixlConnector then notifies the prefill
        worker with no blocks read, which frees them. Nothing is computed and no KV moves."""
        if not isinstance(handle, KVTransferParams):
            raise TypeError(f"{self.name} cannot release a {type(handle).__name__} handle")
        return RELEASE_PATH, {
            "model": RELEASE_MODEL, "prompt": [0], "max_tokens": 1, PARAMS_KEY: handle.for_decode()
        }  # fmt: skip

    def engine_step(self, served_model: str) -> tuple[str, dict[str, Any]]:
        """A one-token request that makes the decode worker's engine step (``routing/kv_release.py``). vLLM's
        connector sends the "nothing read" notification of a refused request from its worker, on an engine step,
        and only once the worker has its NIXL connection to the prefill worker; a pre-aborted request gives an idle
        engine one step, too early when the connection is still being made, so without a later step the blocks wait
        for the decode worker's next request or the lease."""
        return RELEASE_PATH, {"model": served_model, "prompt": [0], "max_tokens": 1}

    def decode_fields(self, handle: TransferHandle) -> dict[str, Any]:
        if not isinstance(handle, KVTransferParams):
            raise TypeError(f"{self.name} cannot decode with a {type(handle).__name__} handle")
        return {PARAMS_KEY: handle.for_decode()}
