"""Where and how to reach Consul: settings merged with Consul's own environment variables.

``ConsulEndpoint.resolve(settings, environ)`` does what the ``consul`` CLI and Consul's Go client do: every connection
value comes from the settings when set there, else from the environment, else a default. It reads no file except the
token file; ``ssl_context()`` and ``client_kwargs()`` turn the result into what ``httpx`` needs.

=============================  ==========================  =============================================
setting                        environment variable        default
=============================  ==========================  =============================================
address                        CONSUL_HTTP_ADDR            127.0.0.1:8500 (``unix:///path`` works too)
ssl                            CONSUL_HTTP_SSL             false; a scheme in the address wins
tls_skip_verify                CONSUL_HTTP_SSL_VERIFY      verify (the variable set to false skips it)
token / token_file             CONSUL_HTTP_TOKEN(_FILE)    none (anonymous); a token file wins
ca_cert / ca_path              CONSUL_CACERT / CAPATH      the system's CAs
client_cert / client_key       CONSUL_CLIENT_CERT / KEY    none
tls_server_name                CONSUL_TLS_SERVER_NAME      the address's host
namespace                      CONSUL_NAMESPACE            none (``?ns=`` not sent)
datacenter                     (settings only)             none (``?dc=`` not sent: the agent's own)
=============================  ==========================  =============================================
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings

DEFAULT_ADDRESS = "127.0.0.1:8500"

_TRUE = frozenset({"1", "t", "true"})
_FALSE = frozenset({"0", "f", "false"})


def parse_bool(value: str, name: str) -> bool:
    """Go's ``strconv.ParseBool``, which is how Consul reads its boolean environment variables."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{name}={value!r} is not a boolean")


@dataclass(frozen=True)
class ConsulEndpoint:
    """A resolved Consul connection. ``token`` is secret: it is left out of ``repr``."""

    base_url: str
    """``http(s)://host:port``; ``http://consul`` when ``uds`` is set."""
    uds: str | None = None
    token: str | None = None
    verify: bool = True
    ca_cert: str | None = None
    ca_path: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    tls_server_name: str | None = None
    datacenter: str | None = None
    namespace: str | None = None

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in ("base_url", "uds", "verify", "ca_cert", "client_cert", "tls_server_name", "datacenter",
                         "namespace")
            if getattr(self, name) is not None
        )
        return f"ConsulEndpoint({shown}, token={'set' if self.token else 'unset'})"

    @property
    def is_tls(self) -> bool:
        return self.base_url.startswith("https://")

    @classmethod
    def resolve(cls, settings: ConsulRegistrySettings, environ: Mapping[str, str] | None = None) -> ConsulEndpoint:
        env = os.environ if environ is None else environ

        def pick(value: str | None, var: str) -> str | None:
            return value if value is not None else (env.get(var) or None)

        address = pick(settings.address, "CONSUL_HTTP_ADDR") or DEFAULT_ADDRESS
        ssl_flag = settings.ssl
        if ssl_flag is None and env.get("CONSUL_HTTP_SSL"):
            ssl_flag = parse_bool(env["CONSUL_HTTP_SSL"], "CONSUL_HTTP_SSL")
        base_url, uds = _base_url(address, ssl_flag or False)

        verify = not settings.tls_skip_verify if settings.tls_skip_verify is not None else True
        if settings.tls_skip_verify is None and env.get("CONSUL_HTTP_SSL_VERIFY"):
            verify = parse_bool(env["CONSUL_HTTP_SSL_VERIFY"], "CONSUL_HTTP_SSL_VERIFY")

        # Precedence: token, token_file, then (as Consul's Go client) CONSUL_HTTP_TOKEN_FILE before CONSUL_HTTP_TOKEN.
        token: str | None
        if settings.token is not None:
            token = settings.token.get_secret_value() or None
        elif token_file := pick(settings.token_file, "CONSUL_HTTP_TOKEN_FILE"):
            token = _read_token(token_file)
        else:
            token = env.get("CONSUL_HTTP_TOKEN") or None

        return cls(
            base_url=base_url,
            uds=uds,
            token=token,
            verify=verify,
            ca_cert=pick(settings.ca_cert, "CONSUL_CACERT"),
            ca_path=pick(settings.ca_path, "CONSUL_CAPATH"),
            client_cert=pick(settings.client_cert, "CONSUL_CLIENT_CERT"),
            client_key=pick(settings.client_key, "CONSUL_CLIENT_KEY"),
            tls_server_name=pick(settings.tls_server_name, "CONSUL_TLS_SERVER_NAME"),
            datacenter=settings.datacenter,
            namespace=pick(settings.namespace, "CONSUL_NAMESPACE"),
        )

    # -- what httpx needs --------------------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for an https endpoint (``None`` for plain http). Loads the CA and client files."""
        if not self.is_tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_cert, capath=self.ca_path)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        elif self.client_key:
            raise ValueError("a Consul client key needs a client certificate (CONSUL_CLIENT_CERT)")
        return ctx

    def headers(self) -> dict[str, str]:
        return {"X-Consul-Token": self.token} if self.token else {}

    def scope_params(self, *, datacenter: bool = True) -> dict[str, str]:
        """``?dc=`` and ``?ns=`` for a request (agent endpoints take no ``dc``: the agent is local)."""
        params: dict[str, str] = {}
        if datacenter and self.datacenter:
            params["dc"] = self.datacenter
        if self.namespace:
            params["ns"] = self.namespace
        return params

    def request_extensions(self) -> dict[str, Any]:
        """Per-request httpx extensions: the TLS server name, when it differs from the address's host."""
        return {"sni_hostname": self.tls_server_name} if self.is_tls and self.tls_server_name else {}

    def client_kwargs(self, timeout_s: float) -> dict[str, Any]:
        """Keyword arguments for ``httpx.AsyncClient``. Proxy variables are ignored: Consul is a local agent."""
        ctx = self.ssl_context()
        verify = ctx if ctx is not None else _unused_tls_context()
        kwargs: dict[str, Any] = {
            "base_url": self.base_url,
            "headers": self.headers(),
            "timeout": httpx.Timeout(timeout_s),
            "trust_env": False,
        }
        if self.uds:
            kwargs["transport"] = httpx.AsyncHTTPTransport(uds=self.uds, verify=verify)
        else:
            kwargs["verify"] = verify
        return kwargs


def _base_url(address: str, ssl_flag: bool) -> tuple[str, str | None]:
    scheme, sep, rest = address.partition("://")
    if not sep:
        return f"{'https' if ssl_flag else 'http'}://{address.rstrip('/')}", None
    scheme = scheme.lower()
    if scheme == "unix":
        return "http://consul", rest
    if scheme in ("http", "https"):
        return f"{scheme}://{rest.rstrip('/')}", None
    raise ValueError(f"unsupported Consul address scheme {scheme!r} in {address!r}")


@functools.cache
def _unused_tls_context() -> ssl.SSLContext:
    """httpx builds a TLS context for every client, even a plain-http one (loading the CA bundle each time); plain
    http never uses it, so every plain-http client shares this one."""
    return ssl.create_default_context()


def _read_token(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise ValueError(f"cannot read the Consul token file {path}: {exc}") from exc
