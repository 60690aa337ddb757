"""bench.role_flip: what the proxy did with the requests during a flip, read from the plugin's counters."""

from __future__ import annotations

import httpx
import pytest

from bench.role_flip import RoutingCounts

PAGE = """# HELP litellm_disagg_requests_total Requests routed, by mode
# TYPE litellm_disagg_requests_total counter
litellm_disagg_requests_total{{model="tiny",mode="disaggregated"}} {remote}
litellm_disagg_requests_total{{model="tiny",mode="local_prefill"}} {local}
litellm_disagg_local_prefills_total{{model="tiny",reason="cost_model"}} {local}
litellm_disagg_routed_total{{model="tiny",role="prefill",worker="switch-1"}} {remote}
litellm_disagg_routed_total{{model="tiny",role="decode",worker="decode-2"}} {decode2}
litellm_disagg_routed_total{{model="tiny",role="decode",worker="switch-1"}} {switch}
"""


def _counts(monkeypatch: pytest.MonkeyPatch, **values: float) -> RoutingCounts:
    text = PAGE.format(**values)
    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(200, text=text))
    return RoutingCounts.read("http://proxy/metrics")


def test_since_names_what_grew_by_mode_reason_and_pool(monkeypatch):
    before = _counts(monkeypatch, remote=2, local=5, decode2=7, switch=0)
    after = _counts(monkeypatch, remote=2, local=17, decode2=18, switch=1)
    assert after.since(before) == "local_prefill 12 (local: cost_model 12); decode: decode-2 11, switch-1 1"


def test_since_says_when_nothing_was_routed(monkeypatch):
    counts = _counts(monkeypatch, remote=1, local=1, decode2=1, switch=1)
    assert counts.since(counts) == "no request routed"
