"""The GPU check scripts (deploy/gpu-check/) are not run here (no GPU); at least they parse, and the worker flags they
pass exist for each engine."""

import subprocess
from pathlib import Path

import pytest

from litellm_disagg import cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "deploy" / "gpu-check"


@pytest.mark.parametrize("name", ["common.sh", "sglang.sh", "trtllm.sh", "vllm-push.sh"])
def test_script_parses(name):
    subprocess.run(["bash", "-n", str(SCRIPTS / name)], check=True)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_worker_flags_of_the_scripts_exist(engine):
    argv = ["worker", "--engine", engine, "--role", "prefill", "--model", "/m", "--served-model-name", "check-model",
            "--host", "127.0.0.1", "--port", "30100", "--nixl-port", "8998", "--registry-dir", "/tmp/r",
            "--worker-id", f"{engine}-prefill-30100", "--kv-events-port", "5557"]
    args = cli.build_parser().parse_args(argv)
    assert args.engine == engine and args.nixl_port == 8998
