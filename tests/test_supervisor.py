"""The supervisor `up` runs its parts under: a dead child is restarted with backoff; only stop() ends them."""

from __future__ import annotations

from pathlib import Path

from litellm_disagg.supervisor import ChildSpec, Supervisor


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def die(self, code: int = -9) -> None:
        self.returncode = code


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path):
    clock, spawned, events = Clock(), [], []

    def spawn(spec: ChildSpec) -> FakeProc:
        proc = FakeProc(len(spawned) + 1)
        spawned.append((spec.name, proc))
        return proc

    specs = [ChildSpec(name, ("true",), {}, tmp_path / f"{name}.log") for name in ("prefill", "decode", "proxy")]
    supervisor = Supervisor(specs, spawn=spawn, clock=clock, initial_backoff_s=1, max_backoff_s=8, stable_after_s=60,
                            on_event=events.append)
    return supervisor, clock, spawned, events


def test_a_dead_child_is_restarted_with_growing_backoff_and_the_others_keep_running(tmp_path):
    supervisor, clock, spawned, events = make(tmp_path)
    supervisor.start()
    assert supervisor.all_alive() and len(spawned) == 3
    delays = []
    for _ in range(5):  # crashes right after each start: 1, 2, 4, 8, 8 s
        prefill = [p for n, p in spawned if n == "prefill"][-1]
        prefill.die()
        supervisor.check()
        assert not supervisor.alive("prefill") and supervisor.alive("decode") and supervisor.alive("proxy")
        started = len(spawned)
        waited = 0.0
        while len(spawned) == started:
            clock.now += 0.5
            waited += 0.5
            supervisor.check()
        delays.append(waited)
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert supervisor.restarts("prefill") == 5 and supervisor.restarts("decode") == 0
    assert "prefill exited with code -9" in events[0] and "restarted (restart 1)" in events[1]


def test_a_child_that_ran_long_enough_starts_again_from_the_first_delay(tmp_path):
    supervisor, clock, spawned, _ = make(tmp_path)
    supervisor.start()
    for _ in range(3):
        [p for n, p in spawned if n == "decode"][-1].die()
        supervisor.check()
        clock.now += 10
        supervisor.check()
    clock.now += 120  # stable for two minutes
    [p for n, p in spawned if n == "decode"][-1].die()
    supervisor.check()
    clock.now += 1
    supervisor.check()
    assert supervisor.alive("decode")


def test_stop_ends_everything_without_restarts(tmp_path, monkeypatch):
    supervisor, clock, spawned, _ = make(tmp_path)
    stopped = []
    monkeypatch.setattr("litellm_disagg.supervisor.stop_process", lambda proc, timeout_s: stopped.append(proc.pid))
    supervisor.start()
    [p for n, p in spawned if n == "prefill"][-1].die()
    supervisor.check()
    supervisor.stop(order=["proxy"])
    clock.now += 100
    supervisor.check()
    assert stopped[0] == 3 and sorted(stopped) == [2, 3]  # the proxy first; the dead prefill is not stopped again
    assert len(spawned) == 3 and not supervisor.alive("prefill")


def test_a_worker_that_drained_on_purpose_stays_stopped_and_one_that_crashed_does_not(tmp_path):
    """``litellm-disagg drain`` (or SIGTERM to one worker): the worker exits 0 and ``up`` leaves it stopped, as
    systemd's ``Restart=on-failure``; a crash of the same worker is restarted; a child without the flag (the proxy)
    is restarted whatever its exit status."""
    clock, spawned, events = Clock(), [], []

    def spawn(spec: ChildSpec) -> FakeProc:
        proc = FakeProc(len(spawned) + 1)
        spawned.append((spec.name, proc))
        return proc

    specs = [ChildSpec("decode", ("true",), {}, tmp_path / "decode.log", restart_after_clean_exit=False),
             ChildSpec("prefill", ("true",), {}, tmp_path / "prefill.log", restart_after_clean_exit=False),
             ChildSpec("proxy", ("true",), {}, tmp_path / "proxy.log")]
    supervisor = Supervisor(specs, spawn=spawn, clock=clock, initial_backoff_s=1, max_backoff_s=8, stable_after_s=60,
                            on_event=events.append)
    supervisor.start()
    procs = dict(spawned)
    procs["decode"].die(0)
    procs["prefill"].die(-9)
    procs["proxy"].die(0)
    for _ in range(20):
        clock.now += 1
        supervisor.check()
    assert not supervisor.alive("decode") and supervisor.restarts("decode") == 0
    assert supervisor.alive("prefill") and supervisor.restarts("prefill") == 1
    assert supervisor.alive("proxy") and supervisor.restarts("proxy") == 1
    assert any("decode exited cleanly" in e and "not restarted" in e for e in events)
