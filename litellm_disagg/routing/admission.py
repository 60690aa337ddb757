"""Admission: which discovery entries may become workers of this router. Entries are claims, not facts.

Anyone who can write to discovery can announce a worker; the router only admits, on every snapshot:

- a served model the operator allows: the names in ``admission.allowed_models`` when set, else the keys of
  ``model_groups`` when that is set, else any (one machine's file registry, ``up``);
- a worker whose hosts (its base URL's and its transfer section's) are allowed: literal IP addresses inside
  ``admission.allowed_networks`` or names listed in ``admission.allowed_hosts``, when either is set;
- never a worker whose model group has deployments the operator configured by hand in the proxy (those groups stay
  LiteLLM's: a registry entry cannot take them over);
- never a worker that requires an API key (``api_key_required``) when this proxy has none to send
  (``worker_auth``): every call to it would be refused.

What is refused is logged once per (worker, reason) and never routed to, as a prefill or a decode worker.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Collection, Iterable
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from litellm_disagg.runtime_config import RuntimeConfig

logger = logging.getLogger(__name__)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AdmissionSettings(BaseModel):
    """The ``admission:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed_models: list[str] | None = None
    """Served model names workers may announce. None: the keys of ``model_groups`` if any, else any name."""
    allowed_networks: list[IPNetwork] | None = None
    """CIDRs a worker's hosts must lie in (IP literals). None with no ``allowed_hosts``: any host."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Host names (not resolved) a worker may use, besides ``allowed_networks``."""


class Admission:
    def __init__(self, settings: AdmissionSettings, *, model_groups: Collection[str] = (), worker_key: bool = False):
        """``worker_key``: whether this proxy has a key for workers that require one."""
        self.settings = settings
        self._worker_key = worker_key
        models = settings.allowed_models if settings.allowed_models is not None else (list(model_groups) or None)
        self._models = None if models is None else frozenset(models)
        self._networks = tuple(settings.allowed_networks or ())
        self._hosts = frozenset(h.lower() for h in settings.allowed_hosts)
        self._check_hosts = settings.allowed_networks is not None or bool(self._hosts)
        self._logged: set[tuple[str, str]] = set()

    def admit(
        self, configs: Iterable[RuntimeConfig], *, operator_group: Callable[[RuntimeConfig], bool] = lambda _: False
    ) -> list[RuntimeConfig]:
        """The entries that may be routed to. ``operator_group(worker)``: its model group has hand-made deployments."""
        admitted = []
        for config in configs:
            reason = self.refusal(config)
            if reason is None and operator_group(config):
                reason = "its model group has deployments configured in the proxy"
            if reason is None:
                admitted.append(config)
            else:
                self._log_once(config.worker_id, reason)
        return admitted

    def refusal(self, config: RuntimeConfig) -> str | None:
        if self._models is not None and config.model not in self._models:
            return f"model {config.model!r} is not allowed"
        if config.api_key_required and not self._worker_key:
            return "it requires an API key and this proxy has none (worker_auth)"
        if self._check_hosts:
            for host in _hosts_of(config):
                if not self._host_allowed(host):
                    return f"host {host!r} is not allowed"
        return None

    def _host_allowed(self, host: str) -> bool:
        if host.lower() in self._hosts:
            return True
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return False  # a name not listed: names are not resolved here (DNS answers are claims too)
        return any(address in network for network in self._networks)

    def _log_once(self, worker_id: str, reason: str) -> None:
        key = (worker_id, reason)
        if key in self._logged:
            return
        if len(self._logged) >= 4096:
            self._logged.clear()
        self._logged.add(key)
        logger.warning("discovery entry %s not admitted: %s", worker_id, reason)


def _hosts_of(config: RuntimeConfig) -> list[str]:
    hosts = [urlsplit(config.base_url).hostname or ""]
    transfer_host = getattr(config.transfer, "host", None)
    if isinstance(transfer_host, str):
        hosts.append(transfer_host)
    return hosts
