"""LogLimit: one line per key per interval, the held-back lines counted into the next one."""

from __future__ import annotations

import pytest

from litellm_disagg.log_limit import LogLimit, held_note


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_line_goes_out_then_one_per_interval_with_the_count_held_back():
    clock = Clock()
    limit = LogLimit(30.0, clock=clock)
    assert limit.take("m") == 0
    assert [limit.take("m") for _ in range(5)] == [None] * 5
    clock.now += 29.9
    assert limit.take("m") is None
    clock.now += 0.1
    assert limit.take("m") == 6
    assert limit.take("m") is None
    clock.now += 30
    assert limit.take("m") == 1


def test_keys_are_independent_and_bounded():
    clock = Clock()
    limit = LogLimit(30.0, max_keys=2, clock=clock)
    assert limit.take(("a", "x")) == 0 and limit.take(("b", "x")) == 0
    assert limit.take(("a", "x")) is None
    assert limit.take(("c", "x")) == 0  # evicts the key least recently logged, ("a", "x")
    assert limit.take(("b", "x")) is None
    assert len(limit._keys) == 2


def test_interval_zero_logs_every_line():
    limit = LogLimit(0.0, clock=Clock())
    assert [limit.take("k") for _ in range(3)] == [0, 0, 0]


def test_held_note_and_bad_settings():
    assert held_note(0) == "" and held_note(3) == " (3 more like it not logged since the last line)"
    with pytest.raises(ValueError):
        LogLimit(-1.0)
    with pytest.raises(ValueError):
        LogLimit(1.0, max_keys=0)


async def test_the_pre_call_hook_names_the_key_once_per_interval_and_strips_every_time(caplog):
    from types import SimpleNamespace

    from litellm_disagg.plugin import DisaggPlugin

    plugin = DisaggPlugin()  # outside the proxy: the hooks alone
    alice = SimpleNamespace(token="hash-a", key_alias="alice-key", user_id="alice", team_id="t1")
    bob = SimpleNamespace(token="hash-b", key_alias=None, user_id="bob", team_id=None)
    sent = []
    with caplog.at_level("WARNING", logger="litellm_disagg.plugin"):
        for key in (alice, alice, alice, bob):
            data = {"model": "m", "kv_transfer_params": {"remote_block_ids": [1]}}
            sent.append(await plugin.async_pre_call_hook(key, None, data, "acompletion"))
    assert all("kv_transfer_params" not in d for d in sent)
    lines = [r.getMessage() for r in caplog.records if "client-supplied" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "key alias alice-key, user alice, team t1" in lines[0] and "user bob" in lines[1]
