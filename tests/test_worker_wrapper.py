"""The worker wrapper's lifecycle, with a fake engine process that has vLLM's /health and /metrics surface."""

import asyncio
import contextlib
import io
import json
import signal
import sys
import threading

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.engines import get_engine
from litellm_disagg.engines.base import LaunchSpec
from litellm_disagg.runtime_config import WorkerRole, WorkerState
from litellm_disagg.workers.log_sink import LogSink
from litellm_disagg.workers.wrapper import LifecycleOptions, WorkerWrapper

from .support.net import free_port


def make(tmp_path, command, **lifecycle):
    port = free_port()
    spec = LaunchSpec(model="m", served_model_name="fake", role=WorkerRole.DECODE, host="127.0.0.1", port=port,
                      transfer_host="127.0.0.1", transfer_port=free_port(), device="cpu")
    log = io.StringIO()
    registry = FileRegistry(tmp_path, poll_interval_s=0.05)
    argv = [a.replace("{port}", str(port)) for a in command]
    opts = LifecycleOptions(worker_id="w1", heartbeat_interval_s=0.2, ready_timeout_s=30, drain_settle_s=0.3, **lifecycle)
    wrapper = WorkerWrapper(spec, opts, registry, engine=get_engine("vllm"), log=log, command=argv)
    return wrapper, FileRegistry(tmp_path), log


FAKE_ENGINE = [sys.executable, "-m", "tests.support.fake_worker", "--port", "{port}", "--name", "fake"]


async def wait_for(check, timeout=30.0):
    for _ in range(int(timeout / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError


async def test_registers_with_facts_from_the_engine_then_drains_on_stop(tmp_path):
    wrapper, reader, _ = make(tmp_path, FAKE_ENGINE)
    run = asyncio.create_task(wrapper.run())

    async def ready():
        return bool(await reader.snapshot())

    await wait_for(ready)
    [config] = await reader.snapshot()
    assert config.worker_id == "w1" and config.state is WorkerState.READY and config.role is WorkerRole.DECODE
    assert (config.block_size, config.kv_capacity_blocks) == (16, 1000)  # read from the engine's metrics
    assert config.base_url == wrapper.server_url + "/v1"
    wrapper.request_stop()
    assert await asyncio.wait_for(run, 30) == 0
    assert await reader.snapshot() == []
    assert wrapper._proc.returncode is not None


async def test_drain_publishes_draining_before_leaving(tmp_path):
    wrapper, reader, _ = make(tmp_path, FAKE_ENGINE)
    wrapper.lifecycle = LifecycleOptions(worker_id="w1", heartbeat_interval_s=0.2, drain_settle_s=1.5)
    run = asyncio.create_task(wrapper.run())

    async def state_is(state):
        snap = await reader.snapshot()
        return bool(snap) and snap[0].state is state

    await wait_for(lambda: state_is(WorkerState.READY))
    wrapper.request_stop()
    await wait_for(lambda: state_is(WorkerState.DRAINING), timeout=5)
    assert await asyncio.wait_for(run, 30) == 0


async def test_engine_death_withdraws_and_exits_nonzero_with_its_last_lines(tmp_path):
    wrapper, reader, log = make(tmp_path, FAKE_ENGINE)
    run = asyncio.create_task(wrapper.run())

    async def ready():
        return bool(await reader.snapshot())

    await wait_for(ready)
    wrapper._proc.send_signal(signal.SIGKILL)
    code = await asyncio.wait_for(run, 30)
    assert code != 0
    assert await reader.snapshot() == []
    assert "Last vLLM log lines" in log.getvalue()


async def test_engine_that_fails_to_start_reports_its_output(tmp_path):
    crash = [sys.executable, "-c", "import sys; print('engine exploded: bad flag'); sys.exit(3)"]
    wrapper, reader, log = make(tmp_path, crash)
    assert await asyncio.wait_for(wrapper.run(), 30) == 3
    assert "engine exploded: bad flag" in log.getvalue()
    assert await reader.snapshot() == []


async def test_an_engine_that_could_not_bind_its_side_channel_port_is_stopped_at_once(tmp_path):
    # vLLM's NIXL handshake listener dies in a thread and the engine waits for it forever: never ready, never exits.
    hang = [sys.executable, "-c", "import time; print(\"zmq.error.ZMQError: Address already in use "
            "(addr='tcp://127.0.0.1:53699')\", flush=True); time.sleep(600)"]
    wrapper, reader, log = make(tmp_path, hang)
    wrapper.lifecycle = LifecycleOptions(worker_id="w1", ready_timeout_s=600)
    code = await asyncio.wait_for(wrapper.run(), 60)  # without the check: the 600 s ready timeout
    assert code != 0
    assert wrapper.bind_failure is not None and wrapper.bind_failure.port == 53699
    assert "could not bind port 53699" in log.getvalue()
    assert await reader.snapshot() == []
    assert wrapper._proc.returncode is not None  # the hung engine was stopped


def _hangs_on_first_start(marker) -> list[str]:
    """An engine whose first start logs uvicorn's start line, then holds its port and answers nothing; later starts
    are the fake engine."""
    script = (
        "import os, socket, sys, time\n"
        f"marker = {str(marker)!r}\n"
        "port = int(sys.argv[1])\n"
        "if not os.path.exists(marker):\n"
        "    open(marker, 'w').close()\n"
        "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    s.bind(('127.0.0.1', port)); s.listen(64)\n"
        "    print('INFO:     Application startup complete.', flush=True)\n"
        "    time.sleep(600)\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'tests.support.fake_worker', '--port', str(port)])\n"
    )
    return [sys.executable, "-c", script, "{port}"]


async def test_an_engine_that_hangs_after_its_server_started_is_started_again(tmp_path):
    # Seen in CI on 2 shared cores: vLLM logged "Application startup complete", then answered nothing, not even
    # /health, until the ready timeout. The wrapper takes it for hung and starts it again.
    marker = tmp_path / "started-once"
    wrapper, reader, log = make(tmp_path / "registry", _hangs_on_first_start(marker), unresponsive_restart_s=1.0)
    run = asyncio.create_task(wrapper.run())

    async def ready():
        return bool(await reader.snapshot())

    await wait_for(ready, timeout=60)  # without the restart: never (the ready timeout, 30 s, ends the run non-zero)
    assert marker.exists()
    assert "hung after its server started" in log.getvalue()
    [config] = await reader.snapshot()
    assert config.state is WorkerState.READY
    wrapper.request_stop()
    assert await asyncio.wait_for(run, 30) == 0


async def test_an_engine_that_hangs_on_every_start_gives_up_after_its_attempts(tmp_path):
    hang = [sys.executable, "-c", "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', "
            "int(sys.argv[1]))); s.listen(64); print('Application startup complete.', flush=True); time.sleep(600)",
            "{port}"]
    wrapper, reader, log = make(tmp_path, hang, unresponsive_restart_s=1.0, start_attempts=2)
    code = await asyncio.wait_for(wrapper.run(), 120)
    assert code != 0
    assert log.getvalue().count("hung after its server started") == 1  # one restart, then it gives up
    assert "did not answer /health for 1 s, in each of 2 starts" in log.getvalue()
    assert await reader.snapshot() == []
    assert wrapper._proc.returncode is not None


class _StuckStream(io.StringIO):
    """A log whose writes block until ``gate`` opens (a disk under writeback pressure, a pipe nobody drains)."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def write(self, text):
        self.gate.wait()
        return super().write(text)


async def test_a_log_that_blocks_does_not_stop_the_heartbeats(tmp_path):
    # Engine lines and the READY line written from the event loop would freeze it on the first blocked write: no
    # heartbeat, and the worker out of discovery past its TTL (seen once in CI). The gate opens on its own after 60 s
    # so that a regression fails here instead of hanging.
    chatty = [sys.executable, "-c", "import sys, runpy; [print('engine line', i, flush=True) for i in range(200)]; "
              "sys.argv = sys.argv[1:]; runpy.run_module('tests.support.fake_worker', run_name='__main__')",
              "x", "--port", "{port}", "--name", "fake"]
    wrapper, reader, _ = make(tmp_path, chatty)
    stuck = _StuckStream()
    wrapper.log = stuck
    opener = threading.Timer(60, stuck.gate.set)
    opener.start()
    run = asyncio.create_task(wrapper.run())
    entry = tmp_path / "w1.worker.json"
    beats = set()
    try:
        while len(beats) < 4 and not stuck.gate.is_set():
            if entry.exists():
                with contextlib.suppress(ValueError, OSError):
                    beats.add(json.loads(entry.read_text())["heartbeat_at"])
            await asyncio.sleep(0.05)
        assert len(beats) >= 4 and not stuck.gate.is_set()  # READY and heartbeating while every log write blocks
    finally:
        stuck.gate.set()
        opener.cancel()
    wrapper.request_stop()
    assert await asyncio.wait_for(run, 30) == 0
    written = stuck.getvalue()
    assert "engine line 199" in written and "READY w1" in written  # nothing lost once the log moved again


def test_the_log_sink_drops_and_counts_what_it_cannot_hold():
    stuck = _StuckStream()
    sink = LogSink(stuck, max_pending=5)
    for i in range(50):
        sink.line(f"line {i}")  # never blocks, although nothing can be written
    assert sink.dropped >= 40
    stuck.gate.set()
    sink.close()
    written = stuck.getvalue()
    assert "line 0" in written and "log lines dropped" in written
