import json
import os
import subprocess
import sys

import pytest

from litellm_disagg.cli import main
from litellm_disagg.engines import get_engine
from litellm_disagg.engines.base import LaunchSpec
from litellm_disagg.engines.vllm.launch import SITECUSTOMIZE_DIR, vllm_argv, vllm_env
from litellm_disagg.runtime_config import VllmNixlTransfer, WorkerRole


def opts(**change):
    base = dict(model="/m", served_model_name="tiny", role=WorkerRole.PREFILL, host="127.0.0.1", port=8100,
                transfer_host="127.0.0.1", transfer_port=5600, device="cpu", kv_cache_bytes=64 << 20, max_model_len=1024)
    return LaunchSpec(**(base | change))


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_roles_map_to_nixl_kv_roles_and_recompute_on_load_failure():
    for role, kv_role in [(WorkerRole.PREFILL, "kv_producer"), (WorkerRole.DECODE, "kv_consumer"), (WorkerRole.BOTH, "kv_both")]:
        config = json.loads(flag(vllm_argv(opts(role=role)), "--kv-transfer-config"))
        assert config == {"kv_connector": "NixlConnector", "kv_role": kv_role, "kv_buffer_device": "cpu", "kv_load_failure_policy": "recompute"}


def test_cpu_flags_and_loopback_environment():
    argv = vllm_argv(opts(), python="py")
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(argv, "--dtype") == "float32" and "--enforce-eager" in argv
    assert flag(argv, "--kv-cache-memory-bytes") == str(64 << 20)
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--port") == "8100"
    env = vllm_env(opts(), base={"VLLM_CPU_KVCACHE_SPACE": "4", "PYTHONPATH": "/x"})
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600" and env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["UCX_NET_DEVICES"] == "lo"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["PYTHONPATH"] == f"{SITECUSTOMIZE_DIR}{os.pathsep}/x"
    assert env["LITELLM_DISAGG_NIXL_PROGRESS_DELAY_US"] == "1000" and "LITELLM_DISAGG_NIXL_PROGRESS_THREAD" not in env
    assert env["LITELLM_DISAGG_NIXL_CPU_PIN"] == "0"  # vLLM's NIXL worker does not pin its thread to one core
    assert vllm_env(opts(), base={"LITELLM_DISAGG_NIXL_CPU_PIN": "1"})["LITELLM_DISAGG_NIXL_CPU_PIN"] == "1"  # experiments


def test_gpu_has_no_cpu_settings_and_a_routable_host_keeps_ucx_free():
    argv = vllm_argv(opts(device="gpu", kv_cache_bytes=None, host="0.0.0.0", transfer_host="10.0.0.5", tensor_parallel_size=2))
    assert "--dtype" not in argv and "--kv-cache-memory-bytes" not in argv
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert json.loads(flag(argv, "--kv-transfer-config"))["kv_buffer_device"] == "cuda"
    env = vllm_env(opts(device="gpu", transfer_host="10.0.0.5"), base={})
    assert "UCX_NET_DEVICES" not in env and "PYTHONPATH" not in env and "LITELLM_DISAGG_NIXL_CPU_PIN" not in env


def test_kv_events_and_extra_args():
    o = opts(kv_events_port=7000, extra_args=("--max-num-seqs", "8"))
    argv = vllm_argv(o)
    events = json.loads(flag(argv, "--kv-events-config"))
    assert events["endpoint"] == "tcp://127.0.0.1:7000" and events["enable_kv_cache_events"] is True  # never "*"
    assert argv[-2:] == ["--max-num-seqs", "8"]


def test_the_adapter_launch_says_what_the_worker_publishes():
    launch = get_engine("vllm").adapter.launch(opts(kv_events_port=7000), python="py", base_env={"A": "1"})
    engine_id = launch.transfer.engine_id
    assert engine_id and launch.argv == tuple(vllm_argv(opts(kv_events_port=7000), python="py", engine_id=engine_id))
    assert launch.env == vllm_env(opts(kv_events_port=7000), base={"A": "1"}) and launch.env["A"] == "1"
    assert launch.transfer == VllmNixlTransfer(host="127.0.0.1", port=5600, engine_id=engine_id)
    assert launch.kv_events_endpoint == "tcp://127.0.0.1:7000"
    assert get_engine("vllm").adapter.launch(opts()).kv_events_endpoint is None


def test_sitecustomize_paces_the_nixl_progress_thread_lazily(tmp_path):
    # A stand-in NIXL backend module shaped like the real one: nixl_agent_config, and nixl_agent building the
    # bindings' config with pthrDelay = 0 before creating the bindings' agent.
    pkg = tmp_path / "nixl_cu12"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_bindings.py").write_text(
        "class nixlAgentConfig:\n"
        "    pthrDelay = None\n"
        "class nixlAgent:\n"
        "    def __init__(self, name, config):\n"
        "        self.delay = config.pthrDelay\n"
    )
    (pkg / "_api.py").write_text(
        "import nixl_cu12._bindings as nixlBind\n"
        "class nixl_agent_config:\n"
        "    def __init__(self, enable_prog_thread=True, num_threads=0):\n"
        "        self.enable_prog_thread = enable_prog_thread\n"
        "def nixl_agent(name, conf=None):\n"
        "    config = nixlBind.nixlAgentConfig()\n"
        "    config.pthrDelay = 0\n"
        "    return nixlBind.nixlAgent(name, config)\n"
    )
    code = (
        "import sys; assert 'nixl_cu12._api' not in sys.modules; from nixl_cu12 import _api; "
        "print(_api.nixl_agent_config().enable_prog_thread, _api.nixl_agent('a').delay)"
    )
    base = {"PYTHONPATH": f"{SITECUSTOMIZE_DIR}{os.pathsep}{tmp_path}", "PATH": os.environ["PATH"]}

    def run(**env: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", code], env=base | env, capture_output=True, text=True, check=True)
        return out.stdout.split()

    assert run(LITELLM_DISAGG_NIXL_PROGRESS_DELAY_US="1000") == ["True", "1000"]  # on, paced
    assert run() == ["True", "0"]  # nothing asked: NIXL untouched
    assert run(LITELLM_DISAGG_NIXL_PROGRESS_THREAD="0") == ["False", "0"]  # off, for experiments


def test_sitecustomize_keeps_vllms_nixl_worker_from_pinning_its_thread(tmp_path):
    # A stand-in for vLLM's module (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py): on CPU its
    # connector worker pins the calling thread with os.sched_setaffinity. The child records that call instead of
    # making it, so the test says the same on a machine of any size.
    module = tmp_path / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "nixl"
    module.mkdir(parents=True)
    for part in [module, *module.parents][: len(module.relative_to(tmp_path).parts)]:
        (part / "__init__.py").write_text("")
    (module / "base_worker.py").write_text(
        "import os\n"
        "class NixlBaseConnectorWorker:\n"
        "    def __init__(self):\n"
        "        self.pid = os.getpid()\n"
        "        if not hasattr(os, 'sched_setaffinity'):\n"
        "            raise NotImplementedError\n"
        "        os.sched_setaffinity(0, [1])\n"
    )
    code = (
        "import os, sys; calls = []; os.sched_setaffinity = lambda pid, mask: calls.append(list(mask)); "
        "assert 'vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker' not in sys.modules; "
        "from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker as W; "
        "w = W(); assert w.pid == os.getpid(); print(calls)"
    )
    base = {"PYTHONPATH": f"{SITECUSTOMIZE_DIR}{os.pathsep}{tmp_path}", "PATH": os.environ["PATH"]}

    def run(**env: str) -> str:
        out = subprocess.run([sys.executable, "-c", code], env=base | env, capture_output=True, text=True, check=True)
        return out.stdout.strip()

    assert run(LITELLM_DISAGG_NIXL_CPU_PIN="0") == "[]"  # the pin skipped, the rest of os untouched
    assert run() == "[[1]]"  # nothing asked: vLLM pins as it does
    assert run(LITELLM_DISAGG_NIXL_CPU_PIN="1") == "[[1]]"


def test_a_kv_lease_goes_into_the_connector_extra_config():
    config = json.loads(flag(vllm_argv(opts(kv_lease_s=600)), "--kv-transfer-config"))
    assert config["kv_connector_extra_config"] == {"kv_lease_duration": 600}
    assert "kv_connector_extra_config" not in json.loads(flag(vllm_argv(opts()), "--kv-transfer-config"))


def test_the_worker_command_refuses_a_lease_vllm_cannot_heartbeat(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["worker", "--role", "prefill", "--model", "m", "--kv-lease-s", "3"])
    assert exc.value.code == 2 and "at least 6 s" in capsys.readouterr().err
