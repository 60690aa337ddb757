"""``litellm-disagg up`` runs the shipped config KV-aware: the model's directory becomes the router's tokenizer, and
a config with KV routing off (or naming its own tokenizer) is left as it is."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from litellm_disagg.settings import DisaggSettings
from litellm_disagg.stack_config import complete_for_stack, shared_compute_share, write_stack_config

ROOT = Path(__file__).resolve().parent.parent


def test_the_shipped_config_routes_kv_aware_precise_with_the_per_request_decision():
    settings = DisaggSettings.from_proxy_config(yaml.safe_load((ROOT / "proxy_config.yaml").read_text()))
    kv = settings.kv_routing
    assert kv.enabled and kv.index.mode == "precise" and kv.disaggregation.mode == "auto"


def test_up_gives_the_router_the_served_models_directory(tmp_path):
    path, kv_on = write_stack_config(ROOT / "proxy_config.yaml", tmp_path, served_model="smol", model_dir="/models/smol")
    assert kv_on and path.parent == tmp_path
    written = yaml.safe_load(path.read_text())
    settings = DisaggSettings.from_proxy_config(written)
    assert settings.kv_routing.tokenizer.model_dirs == {"smol": "/models/smol"}
    shipped = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
    assert written["litellm_settings"] == shipped["litellm_settings"]  # the rest as it was
    assert written["general_settings"]["master_key"] == "os.environ/LITELLM_MASTER_KEY"


def test_a_config_with_kv_routing_off_is_unchanged_and_its_own_tokenizer_and_compute_setting_are_kept():
    off = {"litellm_disagg": {"kv_routing": {"enabled": False}}}
    assert complete_for_stack(off, served_model="m", model_dir="/d") == off
    assert complete_for_stack({}, served_model="m", model_dir="/d") == {}
    own = {"litellm_disagg": {"kv_routing": {"enabled": True, "tokenizer": {"model_dirs": {"m": "/mine"}},
                                             "disaggregation": {"shared_compute": False}}}}
    assert complete_for_stack(own, served_model="m", model_dir="/d") == own


def test_up_tells_the_router_which_share_of_this_machines_compute_its_workers_share(tmp_path):
    """``up`` runs every engine on one machine: a remote prefill is not free compute (disagg_decision.py)."""
    path, _ = write_stack_config(
        ROOT / "proxy_config.yaml", tmp_path, served_model="smol", model_dir="/models/smol", shared_compute=0.25
    )
    disaggregation = DisaggSettings.from_proxy_config(yaml.safe_load(path.read_text())).kv_routing.disaggregation
    assert disaggregation.shared_compute == 0.25 and disaggregation.mode == "auto"
    own_tokenizer = {"litellm_disagg": {"kv_routing": {"enabled": True, "tokenizer": {"model_dirs": {"m": "/mine"}}}}}
    completed = complete_for_stack(own_tokenizer, served_model="m", model_dir="/d", shared_compute=1.0)
    kv = DisaggSettings.from_proxy_config(completed).kv_routing
    assert kv.disaggregation.shared_compute == 1.0 and kv.tokenizer.model_dirs == {"m": "/mine"}


@pytest.mark.parametrize(
    ("device", "cpus", "threads", "engines", "share"),
    [
        ("gpu", 8, 4, 2, 1.0),  # both engines on the same visible GPUs: time-shared
        ("cpu", 2, 1, 2, 0.0),  # up's default on 2 cores: a core each
        ("cpu", 16, 8, 2, 0.0),
        ("cpu", 2, 1, 3, 0.333),  # the 1P+2D benchmark: 3 one-thread engines on 2 cores
        ("cpu", 4, 4, 2, 0.5),  # OMP_NUM_THREADS=4 set by the user on 4 cores
    ],
)
def test_the_shared_share_follows_the_device_and_the_threads_per_core(device, cpus, threads, engines, share):
    assert shared_compute_share(device=device, cpus=cpus, threads_per_engine=threads, engines=engines) == share


def test_an_invalid_section_fails_before_anything_starts():
    with pytest.raises(ValueError):
        complete_for_stack({"litellm_disagg": {"kv_routing": {"enabled": True, "typo": 1}}}, served_model="m", model_dir="/d")
