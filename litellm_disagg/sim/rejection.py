"""What a vLLM decode worker does with a request it refuses before its engine runs it (bad model, bad fields, a
prompt that does not fit) when that request carries a remote prefill's ``kv_transfer_params``: it tells the prefill
engine to free the blocks it holds for it (vLLM's serving layer submits the request pre-aborted,
``notify_kv_transfer_request_rejected``, and the NixlConnector notifies the prefill worker with no blocks read).

The router uses this to release prefill KV that no decode will read (``routing/kv_release.py``), so the simulator
does it too: the refused request's remote lease is released in the directory, at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litellm_disagg.sim.protocol import remote_prefill

if TYPE_CHECKING:
    from litellm_disagg.sim.engine import SimEngine


def release_rejected(engine: SimEngine, raw: Any) -> bool:
    """Release the lease a refused vLLM request's ``kv_transfer_params`` name. True when one was released."""
    if engine.settings.engine_name != "vllm" or not isinstance(raw, dict):
        return False
    params = raw.get("kv_transfer_params")
    remote = remote_prefill(params) if isinstance(params, dict) and params.get("transfer_mode") != "push" else None
    if remote is None:
        return False
    source = engine.directory.get(remote.engine_id)
    if source is None or source.kv_lease(remote.request_id) is None:
        return False
    source.release_kv_lease(remote.request_id)
    return True
