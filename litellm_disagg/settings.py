"""Settings of the proxy plugin; every default lives in the settings class that owns it.

They are read from the ``litellm_disagg:`` section of the LiteLLM proxy config (the same ``proxy_config.yaml``;
LiteLLM ignores sections it does not know). Environment variables override single values where noted, so a
deployment can change them without editing the file.

This module composes: each discovery backend owns its settings class (``discovery/file/settings.py``,
``discovery/consul/settings.py``), KV-aware routing owns ``routing/kv/settings.py``, the planner
``planner/settings.py``; the YAML shape is theirs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.observability.serve import MetricsSettings
from litellm_disagg.observability.tracing import TracingSettings
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.routing.admission import AdmissionSettings
from litellm_disagg.routing.kv.settings import KVRoutingSettings
from litellm_disagg.routing.migration_settings import MigrationSettings
from litellm_disagg.routing.shared_inflight import SharedInflightSettings
from litellm_disagg.routing.worker_auth import WorkerAuthSettings


def _registry_backend(value: Any) -> str:
    """The discriminator of ``RegistrySettings``: ``backend``, ``file`` when absent (existing configs have none)."""
    if isinstance(value, dict):
        return str(value.get("backend", "file"))
    return str(getattr(value, "backend", "file"))


RegistrySettings = Annotated[
    Annotated[FileRegistrySettings, Tag("file")] | Annotated[ConsulRegistrySettings, Tag("consul")],
    Discriminator(_registry_backend),
]
"""The settings of one registry backend, chosen by ``backend`` (default ``file``). Each backend owns its settings
class (``discovery/<backend>/settings.py``); a new backend adds one tag here and one line to
``discovery.factory.BACKENDS``."""


class DisaggSettings(BaseModel):
    """The ``litellm_disagg:`` section of ``proxy_config.yaml``."""

    model_config = ConfigDict(extra="forbid")

    registry: RegistrySettings = Field(default_factory=FileRegistrySettings)
    model_groups: dict[str, str] = Field(default_factory=dict)
    """Served model name -> LiteLLM model group (``model`` the client asks for). Default: the served name itself."""
    picker: Literal["least_inflight", "round_robin"] = "least_inflight"
    """How a worker is chosen among the candidates of a pool (KV-aware scoring plugs in here)."""
    prefill_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    prefill_connect_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    max_prefill_attempts: Annotated[int, Field(ge=1)] = 2
    """Prefill workers tried per request before decoding locally (aggregated)."""
    aggregated_fallback: bool = True
    """With no prefill worker (or all failing), let the decode worker compute the prompt itself instead of failing."""
    kv_routing: KVRoutingSettings = Field(default_factory=KVRoutingSettings)
    """KV-aware selection and conditional disaggregation (see litellm_disagg/routing/kv/README.md); off by default."""
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    """OpenTelemetry spans per request phase (``observability/tracing.py``, docs/observability.md); off by default."""
    migration: MigrationSettings = Field(default_factory=MigrationSettings)
    """Request migration: a stream broken mid-answer continues on another decode worker (``routing/migration.py``)."""
    shared_inflight: SharedInflightSettings = Field(default_factory=SharedInflightSettings)
    """Several proxy replicas share what each has in flight on each worker through Redis (``routing/shared_inflight.py``;
    ``auto``: when LiteLLM's router has a Redis)."""
    failure_cooldown_s: Annotated[float, Field(ge=0)] = 5.0
    """A worker whose call just failed (unreachable, 5xx, timeout) gets no new work for this long, unless it is the
    only one. Bridges the gap between a crash and discovery noticing it."""
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    """Which discovery entries may become workers (allowed models, hosts); see ``routing/admission.py``."""
    worker_auth: WorkerAuthSettings = Field(default_factory=WorkerAuthSettings)
    """The API key the proxy sends its workers (a file, or an environment variable); ``routing/worker_auth.py``."""
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    """Prometheus metrics on a port of their own (``observability/serve.py``); off by default, as LiteLLM's
    ``/metrics`` serves them when its ``prometheus`` callback is on (docs/observability.md)."""
    planner: PlannerSettings = Field(default_factory=PlannerSettings)
    """The dynamic planner (``planner/``, docs/planner.md): moves workers between the prefill, decode and aggregated
    pools against the TTFT/ITL SLOs and publishes the pool sizes it wants; off by default."""
    sync_interval_s: Annotated[float, Field(gt=0)] = 0.5
    """How often the plugin checks that its routing strategy is still installed on the proxy's router."""

    def model_group(self, served_model: str) -> str:
        return self.model_groups.get(served_model, served_model)

    @classmethod
    def from_proxy_config(cls, config: dict[str, Any] | None) -> DisaggSettings:
        section = (config or {}).get("litellm_disagg") or {}
        if not isinstance(section, dict):
            raise ValueError("the 'litellm_disagg' section of the proxy config must be a mapping")
        return cls.model_validate(section)
