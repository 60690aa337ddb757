"""vLLM's NixlPushConnector transfer, concurrent: ``VllmNixlPushProtocol`` and its handle, ``PushTicket``.

What the installed vLLM (0.32, ``distributed/kv_transfer/kv_connector/v1/nixl/push_scheduler.py`` and
``push_worker.py``) does with a request pair, and so what each side must be told:

- Prefill (``kv_transfer_params={"do_remote_decode": true}``, ``max_tokens=1``): computes the prompt, answers at once
  (the same ``kv_transfer_params`` as the pull connector's) and keeps the prompt's blocks under a lease
  (``kv_lease_duration``, 30 s). Its writer thread matches those blocks with a decode's registration.
- Decode (``do_remote_prefill``, ``remote_engine_id``/``remote_host``/``remote_port``/``tp_size`` of the *prefill*
  engine, and a ``remote_request_id``, which the scheduler indexes unconditionally: vLLM 0.32's engine core dies
  with ``KeyError: 'remote_request_id'`` without one; the push itself never uses it): allocates blocks for the whole prompt and, from its writer thread, sends the prefill engine a PUSH_REG
  notification over NIXL (its own engine id, side channel and block ids); the request then waits for the KV.
- The prefill's writer WRITEs its blocks into the decode's as soon as it holds both the finished blocks and the
  registration, whichever came first, and notifies the decode, which then computes only what is left and decodes.
- The two halves are matched by request id with vLLM's random ``-xxxxxxxx`` suffix stripped: both calls carry the
  same ``X-Request-Id`` and use the same endpoint, so their engine request ids agree (``chatcmpl-ID``,
  ``cmpl-ID-0``).

So the decode needs nothing the prefill answers: only the prefill engine's coordinates, which its worker publishes
(``VllmNixlPushTransfer``: host, port, NIXL engine id). The protocol is concurrent: the router sends the decode at
once and the prefill in the background; the decode allocates and registers while the prefill computes.

Failures. A prefill engine that is gone fails the decode's NIXL handshake and the decode recomputes the prompt
(``kv_load_failure_policy=recompute``) or fails. A prefill that fails while its engine lives leaves the decode
waiting (vLLM has no timeout for a registered decode that receives nothing): ``abort_decode`` names vLLM's
``POST /abort_requests`` for both engine request ids, which a decode worker serves only with
``VLLM_SERVER_DEV_MODE=1``; without it the decode waits until its client (LiteLLM's timeout) gives up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from litellm_disagg.engines.base import Endpoint, InvalidTransfer, TransferHandle
from litellm_disagg.engines.vllm.transfer import PARAMS_KEY, build_prefill_body, parse_transfer_params
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlPushTransfer

ABORT_PATH: Final = "abort_requests"
"""vLLM's endpoint that aborts requests by id (served with ``VLLM_SERVER_DEV_MODE=1``)."""


@dataclass(frozen=True, slots=True)
class PushTicket(TransferHandle):
    """What a push-mode decode request carries, known before the prefill runs."""

    protocol: ClassVar[str] = "vllm-nixl-push"

    request_id: str
    """The ``X-Request-Id`` both halves carry (vLLM matches them by it)."""
    prefill_engine_id: str
    prefill_host: str
    prefill_port: int
    prefill_tp_size: int

    def for_decode(self) -> dict[str, Any]:
        """The decode request's ``kv_transfer_params``: a remote prefill, and where the prefill engine is."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.prefill_engine_id,
            "remote_host": self.prefill_host,
            "remote_port": self.prefill_port,
            "tp_size": self.prefill_tp_size,
            # Required by the decode's scheduler (without it vLLM 0.32's engine core dies on a KeyError); in push
            # mode the prefill matches by the decode's own request id, so the client id is what fits.
            "remote_request_id": self.request_id,
            "transfer_mode": "push",
        }

    def engine_request_ids(self) -> list[str]:
        """The ids vLLM's OpenAI server gives the decode request, for chat and for text completions."""
        return [f"chatcmpl-{self.request_id}", f"cmpl-{self.request_id}-0"]


class VllmNixlPushProtocol:
    """``TransferProtocol`` of vLLM's NixlPushConnector (concurrent). Stateless."""

    name = "vllm-nixl-push"
    concurrent = True
    decode_serves_alone = True  # a push-mode decode engine computes a prompt that comes without kv_transfer_params
    client_keys: tuple[str, ...] = (PARAMS_KEY,)

    def open_transfer(self, *, prefill: RuntimeConfig, decode: RuntimeConfig, request_id: str) -> PushTicket:
        transfer = prefill.transfer
        if not isinstance(transfer, VllmNixlPushTransfer):
            raise InvalidTransfer(f"{prefill.worker_id} does not publish a vLLM push transfer section")
        return PushTicket(
            request_id=request_id,
            prefill_engine_id=transfer.engine_id,
            prefill_host=transfer.host,
            prefill_port=transfer.port,
            prefill_tp_size=prefill.tensor_parallel_size,
        )

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
        return build_prefill_body(endpoint, served_model, fields)  # the same prefill request as the pull connector's

    def parse_prefill(
        self,
        payload: Any,
        *,
        prefill: RuntimeConfig,
        handle: TransferHandle | None = None,
        prompt_tokens: int | None = None,
    ) -> PushTicket:
        """The prefill answered: check that it kept the prompt's blocks for a decode, as the engine it published
        (the same ``kv_transfer_params`` and checks as in pull mode); the handle stays the ticket sent."""
        parse_transfer_params(payload, prefill=prefill, prompt_tokens=prompt_tokens)
        if not isinstance(handle, PushTicket):
            raise InvalidTransfer(f"{self.name}: a prefill answer without the ticket it was sent with")
        return handle

    def decode_fields(self, handle: TransferHandle) -> dict[str, Any]:
        if not isinstance(handle, PushTicket):
            raise TypeError(f"{self.name} cannot decode with a {type(handle).__name__} handle")
        return {PARAMS_KEY: handle.for_decode()}

    def abort_decode(self, handle: TransferHandle) -> tuple[str, dict[str, Any]] | None:
        if not isinstance(handle, PushTicket):
            return None
        return ABORT_PATH, {"request_ids": handle.engine_request_ids()}
