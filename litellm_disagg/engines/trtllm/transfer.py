"""TensorRT-LLM's disaggregated serving: ``TrtllmDisaggProtocol`` and its handle, ``DisaggregatedParams``.

The protocol, as TensorRT-LLM's own disaggregated server runs it (``tensorrt_llm/serve/openai_disagg_server.py`` and
``openai_disagg_service.py``: ``_get_ctx_request``, ``_need_gen``, ``_get_gen_request``; the wire model
``DisaggregatedParams`` in ``tensorrt_llm/serve/openai_protocol.py``; the executor side in
``tensorrt_llm/disaggregated_params.py``), sequential (``concurrent = False``):

1. The context (prefill) request is the client's request (its prompt and sampling fields), not streamed (``stream=false``, no ``stream_options``),
   with ``max_tokens=1`` and ``disaggregated_params: {"request_type": "context_only"}`` at the top level.
2. The context server answers one choice whose ``disaggregated_params`` carry ``request_type``,
   ``first_gen_tokens`` (the token it sampled), ``ctx_request_id``, ``encoded_opaque_state`` (base64 of the cache
   transceiver's state: where the generation server fetches the KV from), ``draft_tokens`` and, in newer releases,
   ``disagg_request_id``, ``ctx_dp_rank``, ``ctx_info_endpoint``...
3. The generation (decode) request is the client's request plus those ``disaggregated_params`` verbatim, with
   ``request_type`` changed to ``"generation_only"``; the generation server then receives the KV from the context
   server and continues after ``first_gen_tokens``.

TensorRT-LLM's server skips the generation call when the context answer already finished (``_need_gen``: a
finish reason other than ``length``); LiteLLM makes the decode call regardless, so the generation server produces
the answer then (an answer of one token is generated again, not copied).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from litellm_disagg.engines.base import Endpoint, InvalidTransfer, TransferHandle
from litellm_disagg.engines.openai_fields import prefill_fields
from litellm_disagg.runtime_config import RuntimeConfig

PARAMS_KEY: Final = "disaggregated_params"
MAX_OPAQUE_STATE_CHARS: Final = 256 * 1024
"""The cache transceiver's state (base64) is a few KiB in practice; an answer is a claim, so it is bounded."""
MAX_FIRST_TOKENS: Final = 64
MAX_DRAFT_TOKENS: Final = 4096
MAX_PARAMS_BYTES: Final = 512 * 1024
"""The whole ``disaggregated_params`` object, JSON-encoded (newer releases add keys this module does not type)."""
MAX_PARAMS_KEYS: Final = 32
CONTEXT_ONLY: Final = "context_only"
GENERATION_ONLY: Final = "generation_only"


class DisaggregatedParams(BaseModel, TransferHandle):
    """What a context server returns for its generation request. Known fields typed; passed on verbatim otherwise."""

    model_config = ConfigDict(extra="allow", frozen=True)
    protocol: ClassVar[str] = "trtllm-disagg"

    request_type: Annotated[str, Field(max_length=32)]
    first_gen_tokens: Annotated[list[StrictInt], Field(max_length=MAX_FIRST_TOKENS)] | None = None
    ctx_request_id: StrictInt | None = None
    encoded_opaque_state: Annotated[str, Field(max_length=MAX_OPAQUE_STATE_CHARS)] | None = None
    draft_tokens: Annotated[list[StrictInt], Field(max_length=MAX_DRAFT_TOKENS)] | None = None
    disagg_request_id: StrictInt | None = None

    def for_generation(self) -> dict[str, Any]:
        """The generation request's ``disaggregated_params``: as received, ``request_type`` set to generation_only."""
        return self.model_dump(mode="json", exclude_unset=True) | {"request_type": GENERATION_ONLY}

    @property
    def usable(self) -> bool:
        return self.request_type == CONTEXT_ONLY and bool(self.encoded_opaque_state) and bool(self.first_gen_tokens)


def build_context_body(endpoint: Endpoint, model: str, request: Mapping[str, Any]) -> dict[str, Any]:
    body = prefill_fields(endpoint, request, sampling=True)
    body["model"] = model
    body["max_tokens"] = 1
    if endpoint is Endpoint.CHAT and request.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = 1
    body["stream"] = False
    body[PARAMS_KEY] = {"request_type": CONTEXT_ONLY}
    return body


def parse_context_response(payload: Any) -> DisaggregatedParams:
    """The usable ``disaggregated_params`` of a context server's answer (its one choice). Raises ``InvalidTransfer``."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise InvalidTransfer("the context response has not exactly one choice")
    raw = choices[0].get(PARAMS_KEY)
    if raw is None:
        raise InvalidTransfer(f"the context response has no {PARAMS_KEY}")
    if isinstance(raw, dict) and (len(raw) > MAX_PARAMS_KEYS or len(json.dumps(raw)) > MAX_PARAMS_BYTES):
        raise InvalidTransfer(f"{PARAMS_KEY} over {MAX_PARAMS_KEYS} keys or {MAX_PARAMS_BYTES} bytes")
    try:
        params = DisaggregatedParams.model_validate(raw)
    except ValidationError as exc:
        raise InvalidTransfer(f"invalid {PARAMS_KEY}: {exc}") from exc
    if not params.usable:
        raise InvalidTransfer(f"{PARAMS_KEY} without a context_only state (encoded_opaque_state, first_gen_tokens)")
    return params


class TrtllmDisaggProtocol:
    """``TransferProtocol`` of TensorRT-LLM's context/generation split (sequential). Stateless."""

    name = "trtllm-disagg"
    concurrent = False
    decode_serves_alone = True  # any trtllm-serve takes a request without disaggregated_params
    client_keys: tuple[str, ...] = (PARAMS_KEY,)

    def open_transfer(self, *, prefill: RuntimeConfig, decode: RuntimeConfig, request_id: str) -> None:
        return None

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
        return build_context_body(endpoint, served_model, fields)

    def parse_prefill(
        self,
        payload: Any,
        *,
        prefill: RuntimeConfig,
        handle: TransferHandle | None = None,
        prompt_tokens: int | None = None,
    ) -> DisaggregatedParams:
        return parse_context_response(payload)

    def decode_fields(self, handle: TransferHandle) -> dict[str, Any]:
        if not isinstance(handle, DisaggregatedParams):
            raise TypeError(f"{self.name} cannot decode with a {type(handle).__name__} handle")
        return {PARAMS_KEY: handle.for_generation()}

    def abort_decode(self, handle: TransferHandle) -> None:
        return None
