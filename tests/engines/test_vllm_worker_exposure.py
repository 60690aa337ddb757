"""What a vLLM worker exposes to the network: its KV-event socket binds the worker's own address (never ``*``), and
its API key reaches vLLM through the environment (``VLLM_API_KEY``), never the command line.

The bind is checked with vLLM's own ``ZmqEventPublisher`` in a child process started with the environment the
worker gives vLLM (``vllm_env``: ``sitecustomize/`` on ``PYTHONPATH`` and ``LITELLM_DISAGG_KV_EVENTS_BIND``), about
3 s; the whole engine is started with a key in ``tests/test_e2e_vllm.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from litellm_disagg.engines.base import LaunchSpec
from litellm_disagg.engines.vllm.launch import kv_events_bind, vllm_launch
from litellm_disagg.runtime_config import WorkerRole

from ..support.net import free_port

pytest.importorskip("vllm")

PUBLISH = """
import json, sys, time, psutil
from vllm.distributed.kv_events import ZmqEventPublisher
endpoint = json.loads(sys.argv[1])["endpoint"]
publisher = ZmqEventPublisher(0, endpoint=endpoint, topic="kv")
port = int(endpoint.rsplit(":", 1)[1])
for _ in range(100):
    listening = [c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port]
    if listening:
        break
    time.sleep(0.05)
print(json.dumps(listening))
publisher.shutdown()
"""


def spec(**overrides) -> LaunchSpec:
    return LaunchSpec(**{
        "model": "/m", "served_model_name": "m", "role": WorkerRole.PREFILL, "host": "127.0.0.1", "port": 8100,
        "transfer_host": "127.0.0.1", "transfer_port": 5600, "device": "cpu", "kv_events_port": free_port(),
    } | overrides)


def test_the_kv_event_socket_binds_the_workers_address_not_every_interface():
    s = spec()
    launch = vllm_launch(s, base_env={"PATH": "/usr/bin:/bin"})
    events = json.loads(launch.argv[launch.argv.index("--kv-events-config") + 1])
    assert events["endpoint"] == kv_events_bind(s) == f"tcp://127.0.0.1:{s.kv_events_port}"
    assert launch.kv_events_endpoint == events["endpoint"]
    out = subprocess.run([sys.executable, "-c", PUBLISH, json.dumps(events)], env=dict(launch.env), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # Without the bind patch vLLM would *connect* to this endpoint and nothing would listen on it.
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["127.0.0.1"]


def test_the_api_key_goes_to_vllm_by_environment_and_is_published_only_as_required():
    launch = vllm_launch(spec(api_key="sk-worker-secret", kv_events_port=None), base_env={"VLLM_API_KEY": "stale"})
    assert launch.env["VLLM_API_KEY"] == "sk-worker-secret"
    assert not any("sk-worker-secret" in a for a in launch.argv) and "--api-key" not in launch.argv
    assert "sk-worker-secret" not in repr(spec(api_key="sk-worker-secret"))
    # A worker without a key does not inherit one from its own environment by accident.
    assert "VLLM_API_KEY" not in vllm_launch(spec(kv_events_port=None), base_env={"VLLM_API_KEY": "stale"}).env


def test_the_worker_publishes_its_nixl_engine_id_and_runs_under_it():
    launch = vllm_launch(spec(kv_events_port=None), base_env={})
    config = json.loads(launch.argv[launch.argv.index("--kv-transfer-config") + 1])
    assert launch.transfer.engine_id and config["engine_id"] == launch.transfer.engine_id
    assert vllm_launch(spec(kv_events_port=None), base_env={}).transfer.engine_id != launch.transfer.engine_id
