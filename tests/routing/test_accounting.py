"""Accounting: the one owner of in-flight requests, queued prefill tokens and decode blocks per worker."""

from litellm_disagg.routing.accounting import Accounting, FlightKey, Phase


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def figures(accounting: Accounting, worker_id: str) -> tuple[int, int, int]:
    return accounting.requests(worker_id), accounting.prefill_tokens(worker_id), accounting.decode_blocks(worker_id)


def test_keys_are_typed_and_phases_do_not_collide():
    accounting = Accounting()
    accounting.start(FlightKey.decode("x"), "d1", decode_blocks=4)
    accounting.start(FlightKey.prefill("x"), "p1", prefill_tokens=100)  # same id, other phase: another entry
    assert FlightKey.decode("x").phase is Phase.DECODE and FlightKey.decode("x") != FlightKey.prefill("x")
    assert figures(accounting, "d1") == (1, 0, 4) and figures(accounting, "p1") == (1, 100, 0)
    assert accounting.finish(FlightKey.prefill("x")) == "p1"
    assert figures(accounting, "p1") == (0, 0, 0) and figures(accounting, "d1") == (1, 0, 4)


def test_restart_moves_an_entry_and_a_late_event_of_an_earlier_attempt_ends_nothing():
    accounting = Accounting()
    key = FlightKey.decode("call")
    accounting.start(key, "a", prefill_tokens=10)
    accounting.start(key, "b", prefill_tokens=10)  # a retry elsewhere: counted once, on b
    assert figures(accounting, "a") == (0, 0, 0) and figures(accounting, "b") == (1, 10, 0)
    assert accounting.finish(key, "a") is None  # the failed first attempt's event
    assert accounting.worker_of(key) == "b"
    accounting.prefill_done(key)
    assert figures(accounting, "b") == (1, 0, 0)
    assert accounting.finish(key) == "b" and accounting.finish(key) is None
    assert len(accounting) == 0


def test_entries_expire_oldest_first():
    clock = Clock()
    accounting = Accounting(max_age_s=10, clock=clock)
    accounting.start(FlightKey.decode("old"), "a", prefill_tokens=5, decode_blocks=2)
    clock.now = 8
    accounting.start(FlightKey.decode("new"), "a", decode_blocks=3)
    clock.now = 12
    assert figures(accounting, "a") == (1, 0, 3)  # a lost completion does not pin the worker
    requests, prefill, decode = accounting.lookups()
    assert (requests("a", 0), prefill("a", 0), decode("a", 0), requests("z", 0)) == (1, 0, 3, 0)


def test_pull_tokens_count_until_the_first_token_or_the_end():
    """A decode prefilled remotely: its prompt's KV is on its way to the decode worker until the first token."""
    accounting = Accounting()
    remote, local = FlightKey.decode("remote"), FlightKey.decode("local")
    accounting.start(remote, "d1", decode_blocks=130, pull_tokens=2077)
    accounting.start(local, "d1", prefill_tokens=77, decode_blocks=130)
    assert accounting.pull_tokens("d1") == 2077 and accounting.prefill_tokens("d1") == 77
    assert accounting.pull_lookup()("d1", 0) == 2077 and accounting.pull_lookup()("d2", 0) == 0
    version = accounting.version
    accounting.prefill_done(remote)  # its first token: the pull ended
    assert accounting.pull_tokens("d1") == 0 and accounting.prefill_tokens("d1") == 77
    assert accounting.version > version  # a cached load snapshot is rebuilt
    accounting.start(remote, "d2", pull_tokens=500)  # a retry elsewhere: counted once, on d2
    accounting.start(FlightKey.decode("other"), "d2", pull_tokens=100)
    assert accounting.finish(remote) == "d2"  # ended before its first token (an error)
    assert accounting.pull_tokens("d2") == 100 and accounting.requests("d2") == 1
