"""Command-line flags that choose and configure a registry backend (shared by the ``worker`` and ``workers`` commands).

The ``--consul-*`` flags mirror the ``consul`` CLI's: each one left out falls back to the same environment variable
(``CONSUL_HTTP_ADDR``, ``CONSUL_HTTP_TOKEN``...), resolved in one place, ``discovery/consul/endpoint.py``.
"""

from __future__ import annotations

import argparse

from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.discovery.factory import make_registry
from litellm_disagg.discovery.file.settings import FileRegistrySettings, default_registry_dir
from litellm_disagg.discovery.registry import Registry
from litellm_disagg.settings import RegistrySettings

_CONSUL_FLAGS: tuple[tuple[str, str, str], ...] = (
    # flag, settings field, help
    ("--consul-addr", "address", "Consul HTTP address: host:port, http(s)://host:port or unix:///path "
                                 "(default: $CONSUL_HTTP_ADDR or 127.0.0.1:8500)"),
    ("--consul-token", "token", "ACL token (default: $CONSUL_HTTP_TOKEN_FILE, then $CONSUL_HTTP_TOKEN)"),
    ("--consul-cacert", "ca_cert", "CA file to verify Consul's certificate (default: $CONSUL_CACERT)"),
    ("--consul-client-cert", "client_cert", "client certificate for mutual TLS (default: $CONSUL_CLIENT_CERT)"),
    ("--consul-client-key", "client_key", "key of the client certificate (default: $CONSUL_CLIENT_KEY)"),
    ("--consul-tls-server-name", "tls_server_name", "TLS server name (default: $CONSUL_TLS_SERVER_NAME)"),
    ("--consul-datacenter", "datacenter", "datacenter to read workers from (default: the agent's)"),
    ("--consul-namespace", "namespace", "Consul Enterprise namespace (default: $CONSUL_NAMESPACE)"),
)


def add_registry_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("discovery")
    group.add_argument(
        "--registry", choices=["file", "consul"], default="file", help="registry backend (default: file)"
    )
    group.add_argument(
        "--registry-dir",
        default=None,
        help="file registry directory (default: $LITELLM_DISAGG_REGISTRY_DIR or ~/.cache/litellm-disagg/registry)",
    )
    for flag, _, help_text in _CONSUL_FLAGS:
        group.add_argument(flag, default=None, help=help_text)


def registry_settings_from_args(args: argparse.Namespace) -> RegistrySettings:
    if getattr(args, "registry", "file") == "consul":
        given = {name: value for flag, name, _ in _CONSUL_FLAGS if (value := getattr(args, _dest(flag), None))}
        return ConsulRegistrySettings.model_validate(given)
    return FileRegistrySettings(path=args.registry_dir or default_registry_dir())


def registry_from_args(args: argparse.Namespace) -> Registry:
    return make_registry(registry_settings_from_args(args))


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
