"""Our own metrics port, for a proxy that does not turn on LiteLLM's Prometheus integration (``/metrics``).

Off by default: with ``litellm_settings: callbacks: [..., "prometheus"]`` the proxy's ``/metrics`` already carries
every litellm-disagg metric (they live in prometheus_client's default registry). With ``metrics.port`` set, the
plugin also serves them (and whatever else is in the default registry) on ``http://<metrics.host>:<port>/metrics``
from a background thread of the proxy process, never on the event loop. The host defaults to 127.0.0.1; set
``metrics.host: 0.0.0.0`` to let a Prometheus on another machine scrape it (this port has no authentication).

Several proxy processes (``--num_workers``): with ``PROMETHEUS_MULTIPROC_DIR`` set, the first process to bind the port
serves every process's metrics (prometheus_client's multiprocess collector); the others log that the port is taken.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)


class MetricsSettings(BaseModel):
    """The ``metrics:`` part of the ``litellm_disagg:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Serve the metrics on this port too (None: only where LiteLLM's ``/metrics`` route serves them)."""
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    """Address the port binds to."""


@dataclass
class MetricsServer:
    url: str
    _server: Any

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(settings: MetricsSettings) -> MetricsServer | None:
    """Start the metrics port if one is configured; None when not configured or the port is taken (logged)."""
    if settings.port is None:
        return None
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    registry: Any = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    try:
        server, _thread = start_http_server(settings.port, addr=settings.host, registry=registry)
    except OSError as exc:
        logger.warning("litellm-disagg metrics: cannot listen on %s:%s (%s)", settings.host, settings.port, exc)
        return None
    url = f"http://{settings.host}:{settings.port}/metrics"
    logger.info("litellm-disagg metrics on %s", url)
    return MetricsServer(url, server)


@dataclass(frozen=True)
class MetricsEndpoint:
    url: str
    needs_key: bool
    """The proxy's ``/metrics`` asks for the master key (or a virtual key) unless
    ``litellm_settings.require_auth_for_metrics_endpoint`` is false."""

    def curl(self, key: str) -> str:
        return f'curl -H "Authorization: Bearer {key}" {self.url}' if self.needs_key else f"curl {self.url}"


def metrics_endpoints(proxy_config: dict[str, Any] | None, proxy_base: str) -> list[MetricsEndpoint]:
    """Where a proxy started with ``proxy_config`` (a parsed ``proxy_config.yaml``) serves litellm-disagg's metrics:
    the proxy's ``/metrics`` when LiteLLM's ``prometheus`` callback is on, and ``metrics.port`` when set."""
    config = proxy_config or {}
    settings = config.get("litellm_settings") or {}
    found: list[MetricsEndpoint] = []
    callbacks = settings.get("callbacks") or []
    if "prometheus" in ([callbacks] if isinstance(callbacks, str) else callbacks):
        auth = settings.get("require_auth_for_metrics_endpoint", True) is not False
        # LiteLLM mounts an app at /metrics: /metrics answers 307 to /metrics/ (Prometheus follows it, curl does not).
        found.append(MetricsEndpoint(f"{proxy_base}/metrics/", needs_key=auth))
    section = config.get("litellm_disagg") or {}
    metrics = MetricsSettings.model_validate((section.get("metrics") if isinstance(section, dict) else None) or {})
    if metrics.port is not None:
        found.append(MetricsEndpoint(f"http://{metrics.host}:{metrics.port}/metrics", needs_key=False))
    return found
