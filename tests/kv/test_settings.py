"""KVRoutingSettings: defaults in one place, the README's example validates, unknown keys are refused."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

import litellm_disagg.routing.kv as kv
from litellm_disagg.routing.kv.settings import KVRoutingSettings

README = Path(kv.__file__).with_name("README.md")


def test_defaults() -> None:
    s = KVRoutingSettings()
    assert not s.enabled
    assert s.index.mode == "precise" and s.events.on_gap == "keep"
    assert s.prefill.weights == {"kv_cost": 1.0} and s.prefill.cost.decode == 0.0
    assert s.decode.weights == {"kv_cost": 1.0, "kv_free": 0.25, "prefix_overlap": 0.5, "live_sessions": 1.0}
    assert s.decode.bounded_load is not None and s.prefill.bounded_load is None
    assert (s.decode.cost.prefill, s.decode.cost.decode, s.decode.cost.active) == (1.0, 0.0, 1.0)
    assert s.disaggregation.mode == "auto" and s.disaggregation.min_remote_prefill_tokens is None
    assert s.tokenizer.max_cached_tokens == 1_000_000


def test_readme_example_validates_and_matches_the_defaults() -> None:
    block = re.search(r"```yaml\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    section = yaml.safe_load(block.group(1))["litellm_disagg"]["kv_routing"]
    s = KVRoutingSettings.model_validate(section)
    assert s.enabled and s.tokenizer.model_dirs == {"tiny": "/models/tiny-llama"}
    # everything else in the example is a default
    defaults = KVRoutingSettings.model_validate(
        {"enabled": True, "tokenizer": {"model_dirs": {"tiny": "/models/tiny-llama"}}}
    )
    assert s == defaults


@pytest.mark.parametrize(
    "section",
    [
        {"enabeld": True},
        {"index": {"mode": "exact"}},
        {"prefill": {"weights": {"prefix": 1.0}}},
        {"decode": {"weights": {"load": -1.0}}},
        {"decode": {"weights": {"load": 0.0}}},
        {"disaggregation": {"mode": "sometimes"}},
        {"disaggregation": {"min_remote_prefill_tokens": -5}},
        {"load": {"scrape_interval_s": 0}},
        {"tokenizer": {"max_cached_tokens": -1}},
    ],
)
def test_invalid_sections_are_refused(section: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        KVRoutingSettings.model_validate(section)


def test_the_package_re_exports_nothing() -> None:
    """``routing.kv`` has no public API of its own (import the submodule you need): every public name on it is one of
    its submodules, and importing it alone loads none of them (so no ZMQ and no tokenizer)."""
    submodules = {m.name for m in pkgutil.iter_modules(kv.__path__)}
    assert {"router", "settings", "prefix_index"} <= submodules
    assert not hasattr(kv, "__all__")
    assert {n for n in dir(kv) if not n.startswith("_")} <= submodules
    code = (
        "import sys, litellm_disagg.routing.kv\n"
        "print(sorted(m for m in sys.modules\n"
        "             if m.startswith('litellm_disagg.routing.kv.') or m in ('zmq', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
