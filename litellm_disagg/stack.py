"""``litellm-disagg up``: a local disaggregated stack on one machine.

One prefill worker, one decode worker (each a ``litellm-disagg worker`` process running vLLM) and the LiteLLM proxy
with ``proxy_config.yaml``, sharing a fresh file registry, under a ``Supervisor``: a part that dies is restarted (with
backoff, logged) while the others keep serving (the proxy serves aggregated while the prefill worker is gone). Prints
the base URL, the key and an OpenAI SDK example; only Ctrl-C or SIGTERM stops everything (workers drain).

With KV-aware routing on in the config (the shipped one has it on), the workers publish KV events (``--kv-events-port``)
for the router's precise prefix index, and the proxy runs the config completed with the model's directory for its
tokenizer (``stack_config.py``; written to the run's log directory).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import httpx

from litellm_disagg.discovery.file.settings import ENV_REGISTRY_DIR
from litellm_disagg.engines.vllm import VLLM
from litellm_disagg.ports import avoid_env, free_port, reserve
from litellm_disagg.processes import wait_until
from litellm_disagg.stack_config import shared_compute_share, write_stack_config
from litellm_disagg.supervisor import ChildSpec, Supervisor

STATE_DIR = Path.home() / ".cache" / "litellm-disagg"


def find_proxy_config(explicit: str | None) -> Path:
    candidates = [Path(explicit)] if explicit else [Path.cwd() / "proxy_config.yaml", Path(__file__).resolve().parent.parent / "proxy_config.yaml"]
    for path in candidates:
        if path.is_file():
            return path
    raise SystemExit(f"no proxy config found (looked at {', '.join(map(str, candidates))}); pass --config")


def proxy_ready(base: str, key: str, model: str) -> bool:
    try:
        r = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=2.0)
        return r.status_code == 200 and any(m.get("id") == model for m in r.json().get("data", []))
    except (httpx.HTTPError, ValueError):
        return False


def worker_specs(args: argparse.Namespace, *, model_dir: str, served: str, registry: str, logs: Path,
                 env: dict[str, str], kv_routing: bool) -> list[ChildSpec]:
    """The prefill and decode workers ``up`` starts. No port they draw, nor their KV-event ports, can be the proxy's
    (``args.port``, not bound until the proxy starts) or each other's KV-event port (``ports.py``)."""
    reserve(args.port)
    roles = ("prefill", "decode")
    # KV events for the router's precise prefix index (a restarted worker publishes on the same port).
    events_ports = {role: free_port(args.host) for role in roles} if kv_routing else {}
    env = avoid_env(env, [args.port, *events_ports.values()])
    return [
        ChildSpec(
            role,
            (sys.executable, "-m", "litellm_disagg.cli", "worker", "--role", role, "--model", model_dir,
             "--served-model-name", served, "--host", args.host, "--kv-cache-mib", str(args.kv_cache_mib),
             "--max-model-len", str(args.max_model_len), "--registry-dir", registry,
             *(("--kv-events-port", str(events_ports[role])) if role in events_ports else ())),
            env, logs / f"{role}.log", stop_timeout_s=180, restart_after_clean_exit=False,
        )
        for role in roles
    ]


def run_stack(args: argparse.Namespace) -> int:
    if args.model:
        model_dir = args.model
    else:
        from litellm_disagg.models.smollm2 import prepare_smollm2

        print("preparing SmolLM2-135M-Instruct (offline, once)...", flush=True)
        model_dir = str(prepare_smollm2())
    served = args.served_model_name or Path(model_dir.rstrip("/")).name
    key = os.environ.get("LITELLM_MASTER_KEY") or f"sk-{secrets.token_urlsafe(24)}"
    logs = Path(tempfile.mkdtemp(prefix="up-", dir=_mkdir(STATE_DIR / "runs")))
    registry = args.registry_dir or str(logs / "registry")
    env = dict(os.environ)
    env[ENV_REGISTRY_DIR] = registry
    env["LITELLM_MASTER_KEY"] = key
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    worker_env = dict(env)
    worker_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 2)))
    # The prefill and decode engines run on this machine: how much of each other's compute they take.
    shared = shared_compute_share(device=VLLM.adapter.detect_device(), cpus=os.cpu_count() or 1,
                                  threads_per_engine=_int(worker_env["OMP_NUM_THREADS"], 1), engines=2)
    try:
        # KV-aware routing (on in the shipped config) tokenizes with the served model's own directory.
        config, kv_routing = write_stack_config(find_proxy_config(args.config), logs, served_model=served,
                                                model_dir=model_dir, shared_compute=shared)
    except ValueError as exc:
        raise SystemExit(f"invalid proxy config: {exc}") from exc

    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    specs = worker_specs(args, model_dir=model_dir, served=served, registry=registry, logs=logs, env=worker_env,
                         kv_routing=kv_routing)
    specs.append(ChildSpec(
        "proxy",
        (sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(config), "--host", args.host, "--port", str(args.port)),
        env, logs / "proxy.log", stop_timeout_s=20,
    ))
    supervisor = Supervisor(specs, on_event=lambda message: print(f"litellm-disagg up: {message}", file=sys.stderr, flush=True))

    def supervise() -> bool:
        supervisor.check()
        return True

    try:
        supervisor.start()
        base = f"http://{args.host}:{args.port}"
        print(f"starting workers and the proxy (logs in {logs}); this takes about a minute on CPU...", flush=True)
        wait_until(lambda: proxy_ready(base, key, served) or stopping.is_set(), timeout_s=900, interval_s=1.0,
                   alive=supervise, what="the stack")
        if stopping.is_set():
            return 0
        _wait_both_roles(registry, served, stopping, supervise)
        print(_banner(base, key, served, registry, _metrics_line(config, base, key)), flush=True)
        while not stopping.wait(1.0):
            supervisor.check()
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"the stack did not start: {exc}; logs in {logs}", file=sys.stderr)
        return 1
    finally:
        print("stopping: proxy first, then the workers drain...", flush=True)
        supervisor.stop(order=["proxy"])


def _wait_both_roles(registry: str, served: str, stopping: threading.Event, supervise: Callable[[], bool]) -> None:
    import asyncio

    from litellm_disagg.discovery.file.registry import FileRegistry

    def both_ready() -> bool:
        roles = {c.role.value for c in asyncio.run(FileRegistry(registry).snapshot()) if c.model == served and c.routable}
        return {"prefill", "decode"} <= roles or stopping.is_set()

    wait_until(both_ready, timeout_s=900, interval_s=1.0, alive=supervise, what="both workers")


def _int(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _metrics_line(config: Path, base: str, key: str) -> str:
    """Where the metrics are (docs/observability.md), as a command to run."""
    import yaml

    from litellm_disagg.observability.serve import metrics_endpoints

    try:
        found = metrics_endpoints(yaml.safe_load(config.read_text()), base)
    except (OSError, ValueError, yaml.YAMLError):
        found = []
    if not found:
        return "(not served: add \"prometheus\" to litellm_settings.callbacks, or set litellm_disagg.metrics.port)"
    return "\n             ".join(endpoint.curl(key) for endpoint in found)


def _banner(base: str, key: str, model: str, registry: str, metrics: str = "") -> str:
    return f"""
litellm-disagg is up: prefill and decode workers behind the LiteLLM proxy.

  base URL : {base}/v1
  API key  : {key}
  model    : {model}
  registry : {registry}   (litellm-disagg workers --registry-dir {registry})
  metrics  : {metrics}

  from openai import OpenAI
  client = OpenAI(base_url="{base}/v1", api_key="{key}")
  reply = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "What is the capital of France?"}}])
  print(reply.choices[0].message.content)

A worker or the proxy that dies is restarted (with backoff); a worker drained with `litellm-disagg drain WORKER`
stays stopped; Ctrl-C stops everything.
"""
