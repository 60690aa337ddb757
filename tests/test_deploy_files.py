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


def test_shipped_proxy_config_serves_metrics_and_the_scrape_config_matches():
    config = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
    assert "prometheus" in config["litellm_settings"]["callbacks"]  # mounts /metrics (docs/observability.md)
    assert DisaggSettings.from_proxy_config(config).metrics.port is None
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    [job] = [j for j in prometheus["scrape_configs"] if j["job_name"] == "litellm-proxy"]
    assert job["metrics_path"] == "/metrics/" and job["authorization"]["type"] == "Bearer"


def test_grafana_dashboards_parse_and_every_panel_queries_prometheus():
    import json

    dashboards = sorted((ROOT / "deploy/grafana").glob("*.json"))
    assert dashboards
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        panels = [p for p in dashboard["panels"] if p["type"] != "row"]
        assert panels and len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
        for panel in panels:
            assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
