"""SGLang's PD disaggregation, bootstrap mode: ``SglangBootstrapProtocol`` and its handle, ``BootstrapTicket``.

The protocol, as SGLang's own router sends it (``python/sglang/srt/disaggregation/mini_lb.py``:
``_forward_to_backend``, ``MiniLoadBalancer.generate``), concurrent (``concurrent = True``):

1. The router picks a prefill worker and draws a ``bootstrap_room``: a random integer in ``[0, 2**63 - 1]``
   (``_generate_bootstrap_room``). The prefill worker's bootstrap server is ``bootstrap_host`` (its host) and
   ``bootstrap_port`` (``--disaggregation-bootstrap-port``), published here in its ``SglangBootstrapTransfer``.
2. The same three fields go, at the top level, into both requests, which are sent *at the same time* to the same
   OpenAI endpoint. The decode worker connects to the prefill's bootstrap server, registers the room and allocates
   the prompt's KV; the prefill worker computes the prompt and pushes (WRITEs) the KV into those blocks; the decode
   then generates. The prefill's own answer (one token) only tells the router whether it worked.
3. Failure, on the decode side (``python/sglang/srt/disaggregation/decode.py``, ``.../nixl/conn.py``,
   ``.../common/conn.py``): a room whose KV does not arrive fails after ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``
   (300 s by default) as ``KVPoll.Failed`` -> the request is aborted with HTTP 500 ("Decode transfer failed ...
   timed out ... in KVPoll.WaitingForInput"); a bootstrap server that does not answer, or stops answering its
   heartbeat, fails its rooms sooner. On the prefill side a room no decode registers fails after
   ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (300 s).

Because the decode is already waiting when a prefill fails, the router ends it itself (``abort_decode``: SGLang's
``POST /abort_request`` with the decode's ``rid``, which this protocol sets), so LiteLLM's retry chooses again
(``routing/orchestrator.py`` says how).

The prefill body: the client's prompt and sampling fields as they are (``mini_lb`` sends the same body to both; the
prefill samples the first token, which travels to the decode with the KV), addressed to the prefill worker's served
model, not streamed (``stream=false``), plus the three bootstrap fields.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from litellm_disagg.engines.base import Endpoint, InvalidTransfer, TransferHandle
from litellm_disagg.engines.openai_fields import prefill_fields
from litellm_disagg.runtime_config import RuntimeConfig, SglangBootstrapTransfer

HOST_KEY: Final = "bootstrap_host"
PORT_KEY: Final = "bootstrap_port"
ROOM_KEY: Final = "bootstrap_room"
RID_KEY: Final = "rid"
"""SGLang's request id field (``ChatCompletionRequest.rid``): the router names the decode so it can abort it."""
ABORT_PATH: Final = "abort_request"
"""SGLang's endpoint that aborts a request by ``rid`` (on the server root, not under ``/v1``)."""
MAX_ROOM: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class BootstrapTicket(TransferHandle):
    """One disaggregated request's rendezvous: the prefill worker's bootstrap server and the room both sides use."""

    protocol: ClassVar[str] = "sglang-bootstrap"

    host: str
    port: int
    room: int
    rid: str
    """The decode request's ``rid`` (unique per attempt: a retry gets a new room, so a new rid)."""

    def __post_init__(self) -> None:
        if not 0 <= self.room <= MAX_ROOM:
            raise ValueError(f"bootstrap_room {self.room} is not in [0, 2**63 - 1]")

    def fields(self) -> dict[str, Any]:
        return {HOST_KEY: self.host, PORT_KEY: self.port, ROOM_KEY: self.room}


def new_room(rng: random.Random | None = None) -> int:
    """A fresh ``bootstrap_room``, drawn as SGLang's router draws it."""
    return (rng or random).randint(0, MAX_ROOM)


def open_ticket(prefill: RuntimeConfig, request_id: str, *, room: int | None = None) -> BootstrapTicket:
    transfer = prefill.transfer
    if not isinstance(transfer, SglangBootstrapTransfer):
        raise InvalidTransfer(f"worker {prefill.worker_id} publishes no SGLang bootstrap server")
    room = new_room() if room is None else room
    return BootstrapTicket(transfer.host, transfer.port, room, f"{request_id}-{room:016x}")


def build_prefill_body(
    endpoint: Endpoint, model: str, request: Mapping[str, Any], ticket: BootstrapTicket
) -> dict[str, Any]:
    body = prefill_fields(endpoint, request, sampling=True)
    body["model"] = model
    body["stream"] = False
    body.update(ticket.fields())
    return body


class SglangBootstrapProtocol:
    """``TransferProtocol`` of SGLang's bootstrap PD disaggregation (concurrent). Stateless (rooms are random)."""

    name = "sglang-bootstrap"
    concurrent = True
    decode_serves_alone = False  # a --disaggregation-mode decode server needs a bootstrap room
    client_keys: tuple[str, ...] = (HOST_KEY, PORT_KEY, ROOM_KEY, RID_KEY)

    def open_transfer(self, *, prefill: RuntimeConfig, decode: RuntimeConfig, request_id: str) -> BootstrapTicket:
        return open_ticket(prefill, request_id)

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
        return build_prefill_body(endpoint, served_model, fields, _ticket(handle))

    def parse_prefill(
        self,
        payload: Any,
        *,
        prefill: RuntimeConfig,
        handle: TransferHandle | None = None,
        prompt_tokens: int | None = None,
    ) -> BootstrapTicket:
        # A 200 answer means the prefill computed the prompt and pushed its KV: the handle is the ticket itself. The
        # answer carries nothing the decode uses (the ticket was drawn by the router), so there is nothing to check.
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            raise InvalidTransfer("the prefill's answer is not a completion")
        return _ticket(handle)

    def decode_fields(self, handle: TransferHandle) -> dict[str, Any]:
        ticket = _ticket(handle)
        return {**ticket.fields(), RID_KEY: ticket.rid}

    def abort_decode(self, handle: TransferHandle) -> tuple[str, dict[str, Any]]:
        return ABORT_PATH, {RID_KEY: _ticket(handle).rid}


def _ticket(handle: TransferHandle | None) -> BootstrapTicket:
    if not isinstance(handle, BootstrapTicket):
        raise TypeError(f"sglang-bootstrap needs a BootstrapTicket, got {type(handle).__name__}")
    return handle
