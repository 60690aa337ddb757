"""Free ports are drawn below the kernel's ephemeral range (``litellm_disagg.ports``), and a worker whose engine
could not bind its NIXL side-channel port stops at once instead of waiting forever (a fresh-clone CI run lost a
whole module of real-vLLM tests to one such port: the handshake listener died, the engine never became ready)."""

from __future__ import annotations

import socket

import pytest

from litellm_disagg import ports
from litellm_disagg.cli import run_retrying_taken_port
from litellm_disagg.engines.base import LaunchSpec
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.workers.bind_failure import BindFailure, parse


def test_ports_come_from_below_the_ephemeral_range_and_are_not_handed_out_twice():
    span = ports.draw_range(ports.ephemeral_range())
    if span is None:
        pytest.skip("this kernel leaves no room below its ephemeral range")
    got = [ports.free_port() for _ in range(50)]
    assert len(set(got)) == len(got)
    assert all(span[0] <= p <= span[1] for p in got)
    for p in got[:5]:  # and they are free
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_the_draw_range_leaves_the_kernel_to_pick_when_the_ephemeral_range_starts_low(tmp_path):
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert ports.draw_range(ports.ephemeral_range(f)) == (20000, 32767)
    f.write_text("1024 65535\n")
    assert ports.draw_range(ports.ephemeral_range(f)) is None
    f.write_text("garbage")
    assert ports.ephemeral_range(f) is None


def test_a_port_something_listens_on_is_never_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(ports, "draw_range", lambda _: (port, port))  # the only port to draw is taken
        monkeypatch.setattr(ports, "_given", set())
        assert ports.free_port() != port  # the kernel picks instead


@pytest.mark.parametrize(("line", "port"), [
    ("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:53699')", 53699),
    ("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use", 8000),
    ("OSError: [Errno 98] Address already in use", None),
])
def test_the_engines_bind_failures_are_recognised(line, port):
    assert parse(line) == BindFailure(line, port)


def test_other_lines_are_not_bind_failures():
    assert parse("INFO 12-01 06:00:46 [core.py:402] init engine took 3.51 s") is None


def spec(transfer_port):
    return LaunchSpec(model="m", served_model_name="m", role=WorkerRole.DECODE, host="127.0.0.1", port=1,
                      transfer_host="127.0.0.1", transfer_port=transfer_port, device="cpu")


def test_the_worker_command_starts_again_on_another_port_when_the_one_it_picked_was_taken():
    starts = []

    def run_once(launch):
        starts.append(launch.transfer_port)
        if launch.transfer_port == 111:
            return 1, BindFailure("Address already in use (addr='tcp://127.0.0.1:111')", 111)
        return 0, None

    assert run_retrying_taken_port(spec(111), run_once, repick=lambda: 222) == 0
    assert starts == [111, 222]


def test_an_operators_port_or_another_failure_is_not_retried():
    def taken(launch):
        return 1, BindFailure("in use", launch.transfer_port)

    starts = []

    def counted(launch):
        starts.append(launch)
        return taken(launch)

    assert run_retrying_taken_port(spec(111), counted, repick=None) == 1  # --nixl-port given
    assert run_retrying_taken_port(spec(111), lambda s: (1, BindFailure("in use", 8000)), repick=lambda: 2) == 1
    assert len(starts) == 1
    always = []
    assert run_retrying_taken_port(spec(111), lambda s: (always.append(s), taken(s))[1], repick=lambda: 5, attempts=3) == 1
    assert len(always) == 3


class _Draws:
    """A random source that draws the given ports in order."""

    def __init__(self, *ports: int):
        self.ports = list(ports)

    def randint(self, low: int, high: int) -> int:
        return self.ports.pop(0)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def test_a_reserved_port_or_one_a_parent_chose_is_never_drawn(monkeypatch):
    first, second = _free_ports(2)
    monkeypatch.setattr(ports, "draw_range", lambda _: (1, 65535))
    monkeypatch.setattr(ports, "_given", set())
    monkeypatch.delenv(ports.ENV_AVOID, raising=False)
    monkeypatch.setattr(ports, "_rng", _Draws(first))
    assert ports.free_port() == first  # drawn when nothing says otherwise
    monkeypatch.setattr(ports, "_given", set())
    ports.reserve(first)  # a port given on the command line, not bound yet
    monkeypatch.setattr(ports, "_rng", _Draws(first, second))
    assert ports.free_port() == second
    # A child process: its parent chose `first` for someone else.
    monkeypatch.setattr(ports, "_given", set())
    child_env = ports.avoid_env({"PATH": "/bin"}, [first])
    assert child_env == {"PATH": "/bin", ports.ENV_AVOID: str(first)}
    monkeypatch.setenv(ports.ENV_AVOID, child_env[ports.ENV_AVOID] + ",junk")
    monkeypatch.setattr(ports, "_rng", _Draws(first, second))
    assert ports.free_port() == second
    assert ports.avoid_env({}, [second])[ports.ENV_AVOID] == ",".join(map(str, sorted((first, second))))


def test_up_never_gives_its_workers_the_proxy_port(monkeypatch, tmp_path):
    """``up --port P``: P is not bound until the proxy starts, so a draw could return it; a CI run lost the `up` test
    when the decode worker's KV-event port was the proxy's and its engine failed to bind it on every restart."""
    import argparse

    from litellm_disagg.stack import worker_specs

    proxy, other, third = _free_ports(3)
    monkeypatch.setattr(ports, "draw_range", lambda _: (1, 65535))
    monkeypatch.setattr(ports, "_given", set())
    monkeypatch.delenv(ports.ENV_AVOID, raising=False)
    monkeypatch.setattr(ports, "_rng", _Draws(proxy, other, proxy, third))
    args = argparse.Namespace(port=proxy, host="127.0.0.1", kv_cache_mib=256, max_model_len=2048)
    specs = worker_specs(args, model_dir="/m", served="m", registry=str(tmp_path), logs=tmp_path, env={},
                         kv_routing=True)
    events = {s.name: int(s.argv[s.argv.index("--kv-events-port") + 1]) for s in specs}
    assert events == {"prefill": other, "decode": third}
    for spec in specs:  # the workers' own draws (HTTP, NIXL) avoid the proxy's port and both KV-event ports
        assert set(map(int, spec.env[ports.ENV_AVOID].split(","))) == {proxy, other, third}
