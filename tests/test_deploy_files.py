"""The shipped configs and manifests stay in step with the code: every flag they pass exists, every setting validates."""

import shlex
from pathlib import Path

import pytest
import yaml

from litellm_disagg import cli
from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.settings import DisaggSettings

ROOT = Path(__file__).resolve().parents[1]


def parse_worker(argv: list[str]):
    parser = cli.build_parser()
    return parser.parse_args(argv)


def test_shipped_proxy_config_loads_the_plugin_with_valid_settings():
    config = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
    assert "litellm_disagg.plugin.handler" in config["litellm_settings"]["callbacks"]
    settings = DisaggSettings.from_proxy_config(config)
    assert isinstance(settings.registry, FileRegistrySettings)


def test_kubernetes_proxy_config_uses_consul():
    configmap = yaml.safe_load((ROOT / "deploy/k8s/proxy-config.yaml").read_text())
    settings = DisaggSettings.from_proxy_config(yaml.safe_load(configmap["data"]["proxy_config.yaml"]))
    assert isinstance(settings.registry, ConsulRegistrySettings)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_kubernetes_worker_args_parse(role):
    deployment = yaml.safe_load((ROOT / f"deploy/k8s/{role}-deployment.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["litellm-disagg", "worker"]
    parsed = parse_worker(args[1:])
    assert parsed.role == role and parsed.registry == "consul"


def test_systemd_worker_command_parses():
    unit = (ROOT / "deploy/systemd/litellm-disagg-worker@.service").read_text()
    exec_start = unit.split("ExecStart=", 1)[1].split("\n# ", 1)[0].replace("\\\n", " ")
    argv = shlex.split(exec_start.replace("%i", "decode"))
    assert argv[0].endswith("litellm-disagg")
    assert parse_worker(argv[1:]).registry == "consul"
