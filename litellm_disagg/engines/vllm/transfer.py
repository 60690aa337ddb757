"""vLLM's NixlConnector transfer, pull mode: ``VllmNixlProtocol`` and its handle, ``KVTransferParams``.

The protocol (vLLM v1 ``NixlConnector``), sequential (``concurrent = False``):

1. The prefill request is the client's request with ``max_tokens=1`` (and ``max_completion_tokens=1`` where given),
   ``stream=false``, no ``stream_options``/``min_tokens``/``n``, and ``kv_transfer_params={"do_remote_decode": true}``.
2. The prefill response carries ``kv_transfer_params`` (``do_remote_prefill``, ``remote_block_ids``,
   ``remote_engine_id``, ``remote_request_id``, ``remote_host``, ``remote_port``, ``tp_size``, ...).
3. The decode request is the client's request unchanged, plus those ``kv_transfer_params`` verbatim at the top level;
   the decode worker then pulls the blocks from the prefill worker over NIXL.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, ValidationError

from litellm_disagg.engines.base import Endpoint, InvalidTransfer, TransferHandle
from litellm_disagg.engines.openai_fields import prefill_fields
from litellm_disagg.runtime_config import RuntimeConfig

PARAMS_KEY: Final = "kv_transfer_params"
PREFILL_MARKER: Final[Mapping[str, Any]] = MappingProxyType({"do_remote_decode": True})
"""What the prefill request carries under ``kv_transfer_params`` (copied into each body, never shared)."""

class KVTransferParams(BaseModel, TransferHandle):
    """What a vLLM prefill returns for its decode. Known fields are typed; the whole object is passed on verbatim."""

    model_config = ConfigDict(extra="allow", frozen=True)
    protocol: ClassVar[str] = "vllm-nixl"

    do_remote_prefill: bool = False
    do_remote_decode: bool = False
    remote_engine_id: str | None = None
    remote_request_id: str | None = None
    remote_block_ids: list[Any] | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    tp_size: int | None = None

    def for_decode(self) -> dict[str, Any]:
        """The dict to send as the decode request's top-level ``kv_transfer_params``, exactly as received."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def usable(self) -> bool:
        """True when the decode worker can pull this prompt's KV (the prefill computed and kept it)."""
        return self.do_remote_prefill and bool(self.remote_engine_id)


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


def parse_transfer_params(payload: Any) -> KVTransferParams:
    """The usable ``kv_transfer_params`` of a prefill's JSON response. Raises ``InvalidTransfer``."""
    raw = payload.get(PARAMS_KEY) if isinstance(payload, dict) else None
    if raw is None:
        raise InvalidTransfer(f"the response has no {PARAMS_KEY}")
    try:
        params = KVTransferParams.model_validate(raw)
    except ValidationError as exc:
        raise InvalidTransfer(f"invalid {PARAMS_KEY}: {exc}") from exc
    if not params.usable:
        raise InvalidTransfer(f"{PARAMS_KEY} without a remote prefill (do_remote_prefill, remote_engine_id)")
    return params


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
        self, payload: Any, *, prefill: RuntimeConfig, handle: TransferHandle | None = None
    ) -> KVTransferParams:
        return parse_transfer_params(payload)

    def abort_decode(self, handle: TransferHandle) -> None:
        return None  # sequential: no decode is waiting when a prefill fails

    def decode_fields(self, handle: TransferHandle) -> dict[str, Any]:
        if not isinstance(handle, KVTransferParams):
            raise TypeError(f"{self.name} cannot decode with a {type(handle).__name__} handle")
        return {PARAMS_KEY: handle.for_decode()}
