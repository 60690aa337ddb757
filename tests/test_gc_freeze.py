"""gc_freeze: the proxy's start-up heap left out of full collections, once per process, unless turned off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from litellm_disagg import gc_freeze


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(gc_freeze, "_done", False)
    yield
    gc.unfreeze()  # the test process's own collector as it was


def test_the_objects_tracked_now_are_frozen_once(fresh: None) -> None:
    gc.unfreeze()  # what an earlier test in this process may have frozen (a plugin inside an imported proxy)
    kept = [[i] for i in range(1000)]  # tracked containers alive now
    frozen = gc_freeze.freeze_startup_heap()
    assert frozen >= len(kept) and gc.get_freeze_count() > 0
    assert gc_freeze.freeze_startup_heap() == 0  # once per process: later objects stay collectable


def test_the_environment_turns_it_off(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gc_freeze.ENV, "0")
    gc.unfreeze()
    assert gc_freeze.freeze_startup_heap() == 0 and gc.get_freeze_count() == 0
