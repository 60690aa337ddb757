"""Transitional re-export: vLLM's transfer moved to ``litellm_disagg.engines.vllm.transfer`` (``Endpoint`` to
``litellm_disagg.engines.base``). Delete this module once nothing imports it."""

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.engines.vllm.transfer import PREFILL_MARKER, KVTransferParams, VllmNixlProtocol, build_prefill_body

TRANSFER_KEYS = VllmNixlProtocol.client_keys
"""Was ``routing.request.TRANSFER_KEYS``; now ``litellm_disagg.engines.client_transfer_keys()``."""

__all__ = ["PREFILL_MARKER", "TRANSFER_KEYS", "Endpoint", "KVTransferParams", "build_prefill_body"]
