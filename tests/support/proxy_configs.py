"""Proxy configs for end-to-end tests: the shipped ``proxy_config.yaml`` with a few ``litellm_disagg`` settings changed.

The shipped config routes KV-aware with the per-request remote-or-local decision (``disaggregation.mode: auto``), so
short prompts are often prefilled on the decode worker. Tests whose subject is the KV transfer itself pin
``always`` here; the default decision is tested through ``litellm-disagg up`` (``tests/test_up.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .procs import ROOT


def shipped_with_remote_prefill(out_dir: Path, *, model: str, model_dir: Path | str) -> Path:
    """The shipped config, KV routing as shipped but every prompt prefilled remotely, the model's tokenizer given."""
    config = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
    kv = config["litellm_disagg"]["kv_routing"]
    kv["disaggregation"] = {**(kv.get("disaggregation") or {}), "mode": "always"}
    kv["tokenizer"] = {**(kv.get("tokenizer") or {}), "model_dirs": {model: str(model_dir)}}
    path = out_dir / "proxy_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def plugin_only(disagg: dict[str, Any], *, router: dict[str, Any]) -> dict[str, Any]:
    """A proxy config with no ``model_list`` of its own: the plugin (``litellm_disagg``: ``disagg``) brings every
    deployment from discovery; ``router`` is LiteLLM's ``router_settings``; the master key from the environment."""
    return {
        "model_list": [],
        "litellm_settings": {"callbacks": ["litellm_disagg.plugin.handler"], "drop_params": False},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
        "router_settings": router,
        "litellm_disagg": disagg,
    }
