"""Discovery: where workers publish their ``RuntimeConfig`` and routers find them.

Reading order:

- ``registry``: the ``Registry`` protocol and its contract (publish, heartbeat, withdraw, snapshot, watch, close),
  shared by every backend and checked by one contract test suite (``tests/test_registry_contract.py``).
- ``factory``: ``make_registry(settings)``, one table from backend name to backend, imported on first use.
- ``cli``: the ``--registry`` and ``--consul-*`` flags of the ``worker`` and ``workers`` commands.
- ``status``: whether discovery answers (the ``litellm_disagg_discovery_up`` gauge, one log line per transition).
- ``file/``: the embedded backend, one JSON file per worker in a directory (the default; one machine).
- ``consul/``: the cluster backend on Consul's HTTP API (``docs/consul.md``).

Each backend is one folder holding its ``settings`` (a pydantic class with a ``backend`` tag) and its ``registry``
(a class with ``from_settings``). Workers use the registry through ``workers.lifecycle``; routers through
``routing.controller``.
"""

from litellm_disagg.discovery.registry import Registry, RegistryError

__all__ = ["Registry", "RegistryError"]
