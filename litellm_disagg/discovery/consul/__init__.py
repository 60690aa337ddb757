"""The Consul backend: workers are Consul services, routers follow them with blocking queries (``docs/consul.md``).

Reading order: ``settings`` (``ConsulRegistrySettings``, every default), ``endpoint`` (address, token and TLS from the
settings and ``CONSUL_*``), ``http`` (the HTTP client and its error tree), ``codec`` (RuntimeConfig <-> Meta or KV,
pure), ``reader`` (decoding health entries), ``watch`` (blocking-query loops), then ``registry``, which puts them
together.

The HTTP client is our own thin layer on async httpx rather than py-consul: py-consul's client is synchronous (a
blocking query would hold a thread of the proxy) and its ``consul.aio`` brings aiohttp as a second HTTP stack, while
the registry needs per-request timeouts longer than a blocking query's wait, the raw ``X-Consul-Index`` and
``X-Consul-Results-Filtered-By-ACLs`` headers, and an ``ssl.SSLContext`` with its own TLS server name.

Nothing here is imported until ``discovery.factory`` builds a Consul registry: ``registry`` pulls in
``discovery.status``, whose Prometheus gauge a file-backed proxy does not export. Keep this ``__init__`` free of
imports so that ``settings`` can be read (by ``litellm_disagg.settings``) without it.
"""
