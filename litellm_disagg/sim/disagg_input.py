"""What a generation request asks of the simulated engine's KV transfer, read per engine protocol.

``transfer_request(engine_name, role, body)`` -> ``TransferRequest`` (raises ``ApiError`` for what the engine
refuses):

- ``vllm``: ``kv_transfer_params`` (``do_remote_decode`` on the prefill side, ``do_remote_prefill`` and the remote
  engine's blocks on the decode side; ``protocol.py`` reads them). A failed pull recomputes the prompt.
- ``sglang``: ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``. A prefill worker computes the prompt and one
  token, then pushes the KV into the room; a decode worker registers the room at that bootstrap server and waits for
  the KV, and fails the request (500) when it does not come. A ``both`` worker (SGLang's mode ``null``) ignores them.
- ``trtllm``: ``disaggregated_params``. ``context_only``: compute the prompt, keep its blocks, answer the params
  (``encoded_opaque_state`` names this engine and the blocks); ``generation_only``: fetch the KV the opaque state
  names, and fail the request (500) when that fails; without a usable opaque state the request is refused (400).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from litellm_disagg.runtime_config import EngineName, WorkerRole
from litellm_disagg.sim.api_input import ApiError
from litellm_disagg.sim.protocol import _Request, remote_prefill, wants_remote_decode
from litellm_disagg.sim.request import RemotePrefill


@dataclass(frozen=True)
class TransferRequest:
    do_remote_decode: bool = False
    remote: RemotePrefill | None = None
    push_room: int | None = None
    one_token: bool = False
    """The answer is one token whatever ``max_tokens`` says (an SGLang prefill worker)."""


def bootstrap_engine_id(host: str, port: int) -> str:
    """The directory name of the simulated engine whose bootstrap server is ``host:port``."""
    return f"sglang-bootstrap://{host}:{port}"


def encode_opaque_state(engine_id: str, request_id: str, block_ids: list[int]) -> str:
    state = {"engine_id": engine_id, "request_id": request_id, "block_ids": block_ids}
    return base64.b64encode(json.dumps(state).encode()).decode()


def transfer_request(engine_name: EngineName, role: WorkerRole, body: _Request) -> TransferRequest:
    if engine_name == "sglang":
        return _sglang(role, body)
    if engine_name == "trtllm":
        return _trtllm(body.disaggregated_params)
    params = body.kv_transfer_params
    if params and params.get("transfer_mode") == "push" and params.get("do_remote_prefill") is True:
        return _vllm_push(params)
    return TransferRequest(do_remote_decode=wants_remote_decode(params), remote=remote_prefill(params))


def _vllm_push(params: dict[str, Any]) -> TransferRequest:
    """vLLM's NixlPushConnector, decode side: the prefill engine's coordinates, no blocks (they come pushed)."""
    engine_id = params.get("remote_engine_id")
    if not isinstance(engine_id, str) or not engine_id:
        raise ApiError(400, "a push-mode remote prefill needs remote_engine_id", param="kv_transfer_params")
    return TransferRequest(remote=RemotePrefill(engine_id=engine_id, request_id="", vllm_push=True))


def _sglang(role: WorkerRole, body: _Request) -> TransferRequest:
    room = body.bootstrap_room
    if room is None or role is WorkerRole.BOTH:
        return TransferRequest()
    if role is WorkerRole.PREFILL:
        return TransferRequest(do_remote_decode=True, push_room=room, one_token=True)
    if body.bootstrap_host is None or body.bootstrap_port is None:
        raise ApiError(400, "bootstrap_room needs bootstrap_host and bootstrap_port", param="bootstrap_host")
    source = bootstrap_engine_id(body.bootstrap_host, body.bootstrap_port)
    return TransferRequest(
        remote=RemotePrefill(engine_id=source, request_id=f"room-{room}", push_room=room, fail_on_error=True)
    )


def _trtllm(params: dict[str, Any] | None) -> TransferRequest:
    if params is None:
        return TransferRequest()
    kind = params.get("request_type")
    if kind == "context_only":
        return TransferRequest(do_remote_decode=True)
    if kind == "context_and_generation":
        return TransferRequest()
    if kind != "generation_only":
        raise ApiError(400, f"Unknown request type: {kind}", param="disaggregated_params")
    state = _opaque_state(params.get("encoded_opaque_state"))
    if not isinstance(params.get("first_gen_tokens"), list):
        raise ApiError(
            400, "generation_only needs first_gen_tokens from the context server", param="disaggregated_params"
        )
    return TransferRequest(
        remote=RemotePrefill(
            engine_id=state["engine_id"],
            request_id=state["request_id"],
            block_ids=tuple(state["block_ids"]),
            fail_on_error=True,
        )
    )


def _opaque_state(encoded: Any) -> dict[str, Any]:
    try:
        state = json.loads(base64.b64decode(encoded, validate=True))
    except (TypeError, ValueError, binascii.Error) as exc:
        raise ApiError(400, f"generation_only without a usable encoded_opaque_state: {exc}",
                       param="disaggregated_params") from exc
    ok = (
        isinstance(state, dict)
        and isinstance(state.get("engine_id"), str)
        and isinstance(state.get("request_id"), str)
        and isinstance(state.get("block_ids"), list)
        and all(isinstance(b, int) for b in state["block_ids"])
    )
    if not ok:
        raise ApiError(400, "generation_only with a malformed encoded_opaque_state", param="disaggregated_params")
    return state
