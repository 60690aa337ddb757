"""The proxy config ``litellm-disagg up`` runs: the user's (or the shipped) config, completed for the local stack.

``up`` knows what a config file cannot: the directory of the model it serves, and that its prefill and decode
workers run on this one machine. With KV-aware routing on (the shipped ``proxy_config.yaml``), the router must
tokenize prompts exactly as the workers do, so ``up`` adds ``kv_routing.tokenizer.model_dirs[served name] = model
directory`` (unless the config already names one for that model); and since its engines share this machine, it sets
``kv_routing.disaggregation.shared_compute`` to the share of a remote prefill's compute the decode worker loses
(``shared_compute_share``: 1 on a GPU, which both engines time-share; on CPU, the share by which the engines' threads
outnumber the cores), unless the config sets it, so the remote-or-local decision does not price a remote prefill as
free compute (``routing/kv/disagg_decision.py``). It writes the result next to the run's logs. Nothing else changes; a config with KV routing off is written back as it is
(``up`` always runs the file it printed in its log directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from litellm_disagg.settings import DisaggSettings


def shared_compute_share(*, device: str, cpus: int, threads_per_engine: int, engines: int) -> float:
    """The share of one engine's compute that another engine on this machine takes from it
    (``disaggregation.shared_compute``): 1 on a GPU (``up`` starts every engine on the same visible GPUs, which they
    time-share); on CPU, ``1 - cpus / (engines x threads_per_engine)`` when the threads outnumber the cores, else 0."""
    if device != "cpu":
        return 1.0
    demanded = max(1, engines) * max(1, threads_per_engine)
    return round(max(0.0, 1.0 - max(1, cpus) / demanded), 3)


def complete_for_stack(
    config: dict[str, Any], *, served_model: str, model_dir: str, shared_compute: float = 0.0
) -> dict[str, Any]:
    """A copy of ``config`` whose KV router (when on) tokenizes ``served_model`` from ``model_dir`` and knows which
    share of their compute the workers share (``disaggregation.shared_compute``, unless the config sets it).

    Raises ``ValueError`` (pydantic's) when the ``litellm_disagg`` section is invalid, so ``up`` fails before it
    starts anything rather than the proxy failing later."""
    settings = DisaggSettings.from_proxy_config(config)
    out = dict(config)
    if not settings.kv_routing.enabled:
        return out
    section = dict(out.get("litellm_disagg") or {})
    kv = dict(section.get("kv_routing") or {})
    disaggregation = dict(kv.get("disaggregation") or {})
    if "shared_compute" not in disaggregation:
        kv["disaggregation"] = {**disaggregation, "shared_compute": shared_compute}
    if served_model not in settings.kv_routing.tokenizer.model_dirs:
        tokenizer = dict(kv.get("tokenizer") or {})
        tokenizer["model_dirs"] = {**(tokenizer.get("model_dirs") or {}), served_model: model_dir}
        kv["tokenizer"] = tokenizer
    section["kv_routing"] = kv
    out["litellm_disagg"] = section
    DisaggSettings.from_proxy_config(out)  # still valid
    return out


def kv_routing_on(config: dict[str, Any]) -> bool:
    return DisaggSettings.from_proxy_config(config).kv_routing.enabled


def write_stack_config(
    source: Path, out_dir: Path, *, served_model: str, model_dir: str, shared_compute: float = 0.0
) -> tuple[Path, bool]:
    """Read ``source``, complete it (``complete_for_stack``), write ``out_dir/proxy_config.yaml``.

    Returns the written path and whether KV-aware routing is on (``up`` then starts workers with KV events)."""
    config = yaml.safe_load(source.read_text()) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{source}: a proxy config must be a mapping")
    completed = complete_for_stack(
        config, served_model=served_model, model_dir=model_dir, shared_compute=shared_compute
    )
    path = out_dir / "proxy_config.yaml"
    path.write_text(yaml.safe_dump(completed, sort_keys=False))
    return path, kv_routing_on(completed)
