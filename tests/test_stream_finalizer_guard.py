"""LiteLLM's stream wrapper finalizer writes no context variable when correlation logging is off
(``litellm_disagg/stream_finalizer_guard.py``: such a write from a finalizer can crash CPython 3.11)."""

from __future__ import annotations

import litellm
import pytest
from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper

from litellm_disagg import stream_finalizer_guard


class RecordingLogging:
    def __init__(self) -> None:
        self.restores = 0

    def _restore_correlation_context_if_unclaimed(self) -> None:
        self.restores += 1


def finalize(logging_obj: RecordingLogging) -> None:
    wrapper = object.__new__(CustomStreamWrapper)  # only what __del__ reads
    wrapper.logging_obj = logging_obj
    wrapper.__del__()
    wrapper.logging_obj = None  # the real collection of this object then has nothing to restore


def test_the_finalizer_restores_nothing_when_correlation_logging_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    stream_finalizer_guard.install()
    monkeypatch.setattr(litellm, "request_correlation_in_logs", False)
    recorded = RecordingLogging()
    finalize(recorded)
    assert recorded.restores == 0


def test_with_correlation_logging_on_it_restores_as_litellm_does(monkeypatch: pytest.MonkeyPatch) -> None:
    stream_finalizer_guard.install()
    monkeypatch.setattr(litellm, "request_correlation_in_logs", True)
    recorded = RecordingLogging()
    finalize(recorded)
    assert recorded.restores == 1


def test_installed_once() -> None:
    stream_finalizer_guard.install()
    assert stream_finalizer_guard.install() is False
