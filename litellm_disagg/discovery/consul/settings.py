"""ConsulRegistrySettings: the Consul backend's knobs and defaults (``registry:`` with ``backend: consul``).

``docs/consul.md`` shows every key in a proxy config. Connection values left unset here are resolved from Consul's
own environment variables by ``endpoint.ConsulEndpoint.resolve``, never in this module.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class ConsulRegistrySettings(BaseModel):
    """Discovery through Consul (``docs/consul.md``).

    Connection fields left unset fall back to Consul's own environment variables, exactly as the ``consul`` CLI does
    (``CONSUL_HTTP_ADDR``, ``CONSUL_HTTP_TOKEN``, ``CONSUL_CACERT``...); a value set here wins over the environment.
    """

    model_config = ConfigDict(extra="forbid")

    backend: Literal["consul"] = "consul"

    # -- connection (unset: from the environment, like the consul CLI) ----------------------------------------------
    address: str | None = None
    """``host:port``, ``http(s)://host:port`` or ``unix:///path``. Env ``CONSUL_HTTP_ADDR``, else ``127.0.0.1:8500``."""
    ssl: bool | None = None
    """Use https for an address without a scheme. Env ``CONSUL_HTTP_SSL``."""
    tls_skip_verify: bool | None = None
    """Do not verify the server certificate. Env ``CONSUL_HTTP_SSL_VERIFY=false``."""
    token: SecretStr | None = None
    """ACL token, sent as ``X-Consul-Token``. Env ``CONSUL_HTTP_TOKEN``."""
    token_file: str | None = None
    """File holding the ACL token. Env ``CONSUL_HTTP_TOKEN_FILE``."""
    ca_cert: str | None = None
    """CA bundle to verify the server. Env ``CONSUL_CACERT``."""
    ca_path: str | None = None
    """Directory of CA certificates. Env ``CONSUL_CAPATH``."""
    client_cert: str | None = None
    """Client certificate for mutual TLS. Env ``CONSUL_CLIENT_CERT``."""
    client_key: str | None = None
    """Key of the client certificate. Env ``CONSUL_CLIENT_KEY``."""
    tls_server_name: str | None = None
    """Server name for SNI and certificate verification. Env ``CONSUL_TLS_SERVER_NAME``."""
    datacenter: str | None = None
    """Datacenter to discover workers in (``?dc=``); default: the agent's own."""
    namespace: str | None = None
    """Consul Enterprise namespace (``?ns=``). Env ``CONSUL_NAMESPACE``."""

    # -- naming ------------------------------------------------------------------------------------------------------
    service_name: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    """One Consul service name for every worker; unset: one service per model, ``<service_prefix><model>``."""
    service_prefix: Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[a-z0-9][a-z0-9-]*$")] = (
        "litellm-disagg-"
    )
    tag: Annotated[str, Field(min_length=1, max_length=64)] = "litellm-disagg"
    """Tag on every worker's service; routers only read services carrying it."""
    kv_prefix: Annotated[str, Field(min_length=1, pattern=r"^[^/].*[^/]$|^[^/]$")] = "litellm-disagg/workers"
    """KV prefix for configs too large for service Meta (``<kv_prefix>/<worker_id>/<digest>``)."""
    role_kv_prefix: Annotated[str, Field(min_length=1, pattern=r"^[^/].*[^/]$|^[^/]$")] = "litellm-disagg/roles"
    """KV prefix of role requests (``<role_kv_prefix>/<worker_id>``, ``docs/role-change.md``)."""

    # -- health ------------------------------------------------------------------------------------------------------
    check: Literal["ttl", "http"] = "ttl"
    """``ttl``: workers heartbeat a TTL check. ``http``: the Consul agent polls the worker's ``/health``."""
    check_ttl_s: Annotated[float, Field(gt=0)] = 10.0
    """TTL of the heartbeat check: a worker silent this long turns critical and leaves discovery."""
    check_interval_s: Annotated[float, Field(gt=0)] = 5.0
    """How often the agent polls ``/health`` (``check: http``)."""
    check_timeout_s: Annotated[float, Field(gt=0)] = 2.0
    """Timeout of one ``/health`` poll (``check: http``)."""
    deregister_critical_after_s: Annotated[float, Field(gt=0)] = 60.0
    """A service critical this long is removed by Consul (which enforces a minimum of one minute)."""
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 2.0
    """How often workers pass their TTL check (keep well under ``check_ttl_s``)."""

    # -- reading -----------------------------------------------------------------------------------------------------
    wait_s: Annotated[float, Field(gt=0, le=600)] = 30.0
    """Longest a blocking query waits for a change (Consul caps it at 10 minutes)."""
    min_query_interval_s: Annotated[float, Field(ge=0)] = 0.05
    """Rate limit between two blocking queries on the same resource."""
    request_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """Timeout of a non-blocking request (a blocking one gets ``wait_s`` on top)."""
    retry_min_s: Annotated[float, Field(gt=0)] = 0.5
    retry_max_s: Annotated[float, Field(gt=0)] = 10.0
    """Backoff between retries while Consul is unreachable."""

    @model_validator(mode="after")
    def _consistent(self) -> ConsulRegistrySettings:
        if self.check == "ttl" and self.heartbeat_interval_s >= self.check_ttl_s:
            raise ValueError("heartbeat_interval_s must be shorter than check_ttl_s")
        if self.retry_min_s > self.retry_max_s:
            raise ValueError("retry_min_s must not exceed retry_max_s")
        return self
