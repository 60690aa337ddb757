"""The planner's settings as shipped: proxy_config.yaml's planner section is valid, off, and says the defaults."""

from __future__ import annotations

from pathlib import Path

import yaml

from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.settings import DisaggSettings

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_planner_section_is_off_and_lists_the_defaults() -> None:
    config = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
    section = config["litellm_disagg"]["planner"]
    assert DisaggSettings.from_proxy_config(config).planner == PlannerSettings()
    assert section["enabled"] is False
    assert set(section) == set(PlannerSettings.model_fields)
