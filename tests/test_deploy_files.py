"""The shipped configs and manifests stay in step with the code: every flag they pass exists, every setting validates."""

import re
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


def test_kubernetes_proxy_config_routes_like_the_shipped_one():
    """KV-aware routing on, as in the shipped proxy_config.yaml (and so in ``up``), with the same LiteLLM settings;
    the k8s workers publish the KV events its precise index reads, on the port the NetworkPolicy opens to the proxy."""
    shipped = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
    configmap = yaml.safe_load((ROOT / "deploy/k8s/proxy-config.yaml").read_text())
    k8s = yaml.safe_load(configmap["data"]["proxy_config.yaml"])
    for section in ("litellm_settings", "general_settings", "router_settings"):
        assert k8s[section] == shipped[section], section
    shipped_kv = DisaggSettings.from_proxy_config(shipped).kv_routing
    k8s_kv = DisaggSettings.from_proxy_config(k8s).kv_routing
    assert shipped_kv.enabled and k8s_kv == shipped_kv
    assert k8s_kv.index.mode == "precise" and k8s_kv.tokenizer.http_fallback  # no model directory in the proxy pod
    [policy] = _k8s("network-policy.yaml")
    [from_proxy] = [r for r in policy["spec"]["ingress"]
                    if r["from"] == [{"podSelector": {"matchLabels": {"app": "litellm-disagg", "role": "proxy"}}}]]
    for role in ("prefill", "decode"):
        [container] = _k8s(f"{role}-deployment.yaml")[0]["spec"]["template"]["spec"]["containers"]
        events_port = parse_worker(container["args"][1:]).kv_events_port
        assert events_port is not None, role
        assert {"name": "kv-events", "containerPort": events_port} in container["ports"]
        assert {"protocol": "TCP", "port": events_port} in from_proxy["ports"]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_kubernetes_worker_args_parse(role):
    deployment = yaml.safe_load((ROOT / f"deploy/k8s/{role}-deployment.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["litellm-disagg", "worker"]
    parsed = parse_worker(args[1:])
    assert parsed.role == role and parsed.registry == "consul"


def _env_file(path: Path) -> dict[str, str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_systemd_worker_instances_parse_and_do_not_share_a_port_or_gpu():
    unit = (ROOT / "deploy/systemd/litellm-disagg-worker@.service").read_text()
    exec_start = unit.split("ExecStart=", 1)[1].split("\n# ", 1)[0].replace("\\\n", " ")
    shared = _env_file(ROOT / "deploy/systemd/litellm-disagg.env")
    taken: dict[str, set[str]] = {"ports": set(), "gpus": set()}
    for role in ("prefill", "decode"):
        env = shared | _env_file(ROOT / f"deploy/systemd/worker-{role}.env")
        assert "/etc/litellm-disagg/worker-%i.env" in unit
        command = re.sub(r"\$\{(\w+)\}", lambda m, env=env: env[m.group(1)], exec_start.replace("%i", role))
        argv = shlex.split(command)
        assert argv[0].endswith("litellm-disagg")
        args = parse_worker(argv[1:])
        assert args.role == role and args.registry == "consul"
        assert args.kv_events_port is not None  # for the shipped config's KV-aware routing
        ports = {str(args.port), str(args.nixl_port), str(args.kv_events_port)}
        assert len(ports) == 3 and not ports & taken["ports"]  # two instances on one host must not clash
        assert env["CUDA_VISIBLE_DEVICES"] not in taken["gpus"]
        taken["ports"] |= ports
        taken["gpus"].add(env["CUDA_VISIBLE_DEVICES"])


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


def _k8s(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / f"deploy/k8s/{name}").read_text()) if d]


def _secret_refs(deployment: dict) -> set[tuple[str, str]]:
    """(secret, key) pairs a deployment's containers read, and (secret, "<volume>") for mounted ones."""
    spec = deployment["spec"]["template"]["spec"]
    refs = {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for c in spec["containers"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    return refs | {(v["secret"]["secretName"], "<volume>") for v in spec.get("volumes", []) if "secret" in v}


def test_each_component_gets_only_its_own_secrets():
    secrets = {s["metadata"]["name"]: s["stringData"] for s in _k8s("secret.example.yaml")}
    assert set(secrets) == {"litellm-disagg-proxy", "litellm-disagg-worker", "litellm-disagg-worker-api-key"}
    assert "LITELLM_MASTER_KEY" not in secrets["litellm-disagg-worker"]
    [proxy] = [d for d in _k8s("proxy-deployment.yaml") if d["kind"] == "Deployment"]
    proxy_refs = _secret_refs(proxy)
    assert {name for name, _ in proxy_refs} == {"litellm-disagg-proxy", "litellm-disagg-worker-api-key"}
    for role in ("prefill", "decode"):
        [worker] = _k8s(f"{role}-deployment.yaml")
        refs = _secret_refs(worker)
        assert {name for name, _ in refs} == {"litellm-disagg-worker", "litellm-disagg-worker-api-key"}
        assert all(key != "LITELLM_MASTER_KEY" for _, key in refs)
        # The worker's key comes from the mounted file, the same file the proxy's config names.
        args = parse_worker(worker["spec"]["template"]["spec"]["containers"][0]["args"][1:])
        assert args.api_key_file == "/etc/litellm-disagg-worker-key/api-key"
        mounts = worker["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "worker-key", "mountPath": "/etc/litellm-disagg-worker-key", "readOnly": True} in mounts
    configmap = yaml.safe_load((ROOT / "deploy/k8s/proxy-config.yaml").read_text())
    settings = DisaggSettings.from_proxy_config(yaml.safe_load(configmap["data"]["proxy_config.yaml"]))
    assert settings.worker_auth.api_key_file == "/etc/litellm-disagg-worker-key/api-key"


def test_the_network_policy_lets_only_the_proxy_and_other_workers_reach_a_worker():
    [policy] = _k8s("network-policy.yaml")
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["policyTypes"] == ["Ingress"]
    workers = {"key": "role", "operator": "In", "values": ["prefill", "decode", "switchable"]}
    assert workers in policy["spec"]["podSelector"]["matchExpressions"]
    by_port: dict[int, list[dict]] = {}
    for rule in policy["spec"]["ingress"]:
        assert rule["from"], "a rule without sources would admit everyone"
        for port in rule["ports"]:
            by_port.setdefault(port["port"], []).extend(rule["from"])
    http = int(parse_worker(_k8s("prefill-deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]["args"][1:]).port)
    assert by_port[http] == [{"podSelector": {"matchLabels": {"app": "litellm-disagg", "role": "proxy"}}}]
    assert by_port[5600] == [{"podSelector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["litellm-disagg"]}, workers]}}]


def test_planner_managed_workers_scale_on_the_planners_sizes_and_park_before_the_replicaset_removes_them():
    """deploy/k8s/planner/: switchable workers, KEDA on the desired sizes, the hook that parks the named worker."""
    from litellm_disagg.observability import metrics
    from litellm_disagg.planner.lock import CONSUL_LOCK_KEY
    from litellm_disagg.planner.settings import PlannerSettings

    [deployment] = _k8s("planner/switchable-workers-deployment.yaml")
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"] == deployment["spec"]["selector"]["matchLabels"] == {
        "app": "litellm-disagg", "role": "switchable"}
    [container] = pod["spec"]["containers"]
    worker = parse_worker(container["args"][1:])
    assert worker.switchable and worker.registry == "consul" and worker.kv_events_port is not None
    # parked = vLLM stopped = /health on the engine's port fails = not ready; nothing may restart it for that
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": int(worker.port)}
    assert "livenessProbe" not in container
    assert pod["spec"]["terminationGracePeriodSeconds"] >= worker.drain_timeout + 30
    assert {name for name, _ in _secret_refs(deployment)} == {"litellm-disagg-worker", "litellm-disagg-worker-api-key"}

    [scaled] = _k8s("planner/keda-scaledobject.yaml")
    assert scaled["kind"] == "ScaledObject" and scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1"  # replicas = the planner's total
    query = trigger["metadata"]["query"]
    assert metrics.PLANNER_DESIRED_WORKERS._name in query and f"{metrics.PLANNER_LEADER._name} == 1" in query
    assert f'model="{worker.served_model_name}"' in query
    scale_down = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert scale_down["stabilizationWindowSeconds"] > worker.drain_timeout  # the parked drain finishes first

    section = yaml.safe_load((ROOT / "deploy/k8s/planner/proxy-planner-section.yaml").read_text())
    planner = PlannerSettings.model_validate(section["planner"])
    assert planner.enabled and scaled["spec"]["minReplicaCount"] == planner.min_prefill_workers + planner.min_decode_workers
    assert planner.hook_command is not None and planner.hook_command[0] == "litellm-disagg"
    hook = cli.build_parser().parse_args([*planner.hook_command[1:], "llama-3.1-8b", "1", "2", "0"])  # as the hook runs it
    assert hook.command == "drain-hook" and hook.park and hook.registry == "consul"
    # the merged config still validates as the proxies' section
    configmap = yaml.safe_load((ROOT / "deploy/k8s/proxy-config.yaml").read_text())
    merged = yaml.safe_load(configmap["data"]["proxy_config.yaml"])
    merged["litellm_disagg"]["planner"] = section["planner"]
    assert DisaggSettings.from_proxy_config(merged).planner == planner

    policy = (ROOT / "deploy/consul/planner-policy.hcl").read_text()
    role_prefix = ConsulRegistrySettings().role_kv_prefix
    assert re.search(rf'key_prefix "{re.escape(role_prefix)}/" {{\s*policy = "write"', policy)
    assert re.search(rf'key "{re.escape(CONSUL_LOCK_KEY)}" {{\s*policy = "write"', policy)
    assert re.search(r'session_prefix "" {\s*policy = "write"', policy)
