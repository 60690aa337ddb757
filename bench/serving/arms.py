"""One LiteLLM proxy config per arm: the routing strategies compared, over the same workers.

| arm                | who picks the worker                                                                          |
|--------------------|-----------------------------------------------------------------------------------------------|
| ``kv_aware``       | litellm-disagg's strategy, ``kv_routing`` on (prefix overlap + load), no session header       |
| ``simple_shuffle`` | LiteLLM ``routing_strategy: simple-shuffle`` (its default)                                     |
| ``least_busy``     | LiteLLM ``routing_strategy: least-busy``                                                       |
| ``session_affinity`` | LiteLLM simple-shuffle + ``optional_pre_call_checks: ["session_affinity"]``; the client sends |
|                    | ``x-litellm-session-id`` (its strongest built-in answer to prefix reuse)                      |
| ``round_robin``    | the client, rotating over per-worker model groups (``<model>@<i>``)                           |
| ``oracle``         | the client: each ``prefix_key`` (conversation or shared document) always to the worker it went |
|                    | to first; first placements spread evenly                                                      |
| ``oracle_plugin``  | the oracle's placement, through a proxy that also runs the litellm-disagg plugin with KV      |
|                    | routing on (discovery, KV events, load scraping, every hook) for one group it never routes:   |
|                    | what the plugin costs a request whose worker it does not choose (not in the default arms)     |

LiteLLM's arms list the workers as plain deployments of the engine's LiteLLM provider (``hosted_vllm``); the KV-aware arm lists none and finds the
workers in discovery (the file registry) like a production proxy. The pinned arms (round robin, oracle) go through
the same proxy on per-worker groups, so every arm pays LiteLLM's proxy overhead; the KV-aware arm also runs the
litellm-disagg plugin (its routing and its per-chunk stream hooks), the others do not (docs/benchmarks.md, "Skewed and
multi-turn at full speed again": about 10% of the KV proxy's CPU). ``oracle_plugin`` splits that: its proxy runs the
plugin's background work and hooks but not its selection (the client pins each request to a per-worker group, which
the plugin leaves to LiteLLM), so ``oracle`` -> ``oracle_plugin`` is what the plugin costs around a request and
``oracle_plugin`` -> ``kv_aware`` is its selection (tokenizing, scoring, the decision) and its placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bench.serving.workers import ENGINE, WorkerSet

ArmName = Literal["kv_aware", "simple_shuffle", "least_busy", "session_affinity", "round_robin", "oracle",
                  "oracle_plugin"]
DEFAULT_ARMS: tuple[ArmName, ...] = (
    "kv_aware", "simple_shuffle", "least_busy", "session_affinity", "round_robin", "oracle",
)
ARMS: tuple[ArmName, ...] = (*DEFAULT_ARMS, "oracle_plugin")


@dataclass(frozen=True)
class Arm:
    name: ArmName
    config: dict[str, Any]
    pinned: bool = False
    """The client names a per-worker group (``<model>@<index>``) itself."""
    session_header: bool = False


def pinned_group(model: str, index: int) -> str:
    return f"{model}@{index}"


def build(name: ArmName, workers: WorkerSet, *, kv_routing: dict[str, Any] | None = None,
          redis_port: int | None = None) -> Arm:
    """``redis_port``: the proxies' router names a Redis on 127.0.0.1 (LiteLLM's state across replicas, and
    litellm-disagg's in-flight exchange, ``shared_inflight: auto``)."""
    base: dict[str, Any] = {
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
        "litellm_settings": {"drop_params": False, "request_timeout": 600},
        "router_settings": {"num_retries": 1, "timeout": 600},
    }
    if redis_port is not None:
        base["router_settings"] |= {"redis_host": "127.0.0.1", "redis_port": redis_port}
    kv: dict[str, Any] = {"enabled": True, "disaggregation": {"mode": "never"}}
    if workers.model_dir:
        kv["tokenizer"] = {"model_dirs": {workers.model: workers.model_dir}}
    kv.update(kv_routing or {})
    plugin = {
        "registry": {"backend": "file", "path": str(workers.registry_dir), "poll_interval_s": 0.25},
        "kv_routing": kv,
    }
    if name == "kv_aware":
        base["model_list"] = []
        base["litellm_settings"]["callbacks"] = ["litellm_disagg.plugin.handler"]
        base["litellm_disagg"] = plugin
        return Arm(name, base)

    def deployment(group: str, url: str) -> dict[str, Any]:
        model = f"{ENGINE.adapter.provider_prefix}/{workers.model}"
        return {"model_name": group, "litellm_params": {"model": model, "api_base": f"{url}/v1", "api_key": "none"}}

    pinned = [deployment(pinned_group(workers.model, i), w.server_url) for i, w in enumerate(workers.workers)]
    if name == "oracle_plugin":  # the plugin serves the plain group from discovery (the warm-up's); the load is pinned
        base["model_list"] = pinned
        base["router_settings"]["routing_strategy"] = "simple-shuffle"
        base["litellm_settings"]["callbacks"] = ["litellm_disagg.plugin.handler"]
        base["litellm_disagg"] = plugin
        return Arm(name, base, pinned=True)
    base["model_list"] = [deployment(workers.model, w.server_url) for w in workers.workers] + pinned
    router = base["router_settings"]
    router["routing_strategy"] = "least-busy" if name == "least_busy" else "simple-shuffle"
    if name == "session_affinity":
        router["optional_pre_call_checks"] = ["session_affinity"]
    return Arm(name, base, pinned=name in ("round_robin", "oracle"), session_header=name == "session_affinity")


class Placement:
    """The client-side choice of the pinned arms: round robin, or the oracle's sticky placement by prefix key."""

    def __init__(self, arm: ArmName, workers: int):
        self.arm = arm
        self.workers = workers
        self._next = 0
        self._sticky: dict[str, int] = {}
        self._keys_per_worker = [0] * workers

    def pick(self, prefix_key: str) -> int:
        if self.arm == "round_robin":
            index = self._next % self.workers
            self._next += 1
            return index
        index = self._sticky.get(prefix_key)
        if index is None:
            index = min(range(self.workers), key=lambda i: (self._keys_per_worker[i], i))
            self._sticky[prefix_key] = index
            self._keys_per_worker[index] += 1
        return index
