"""litellm-disagg: disaggregated prefill/decode serving as a plugin for the LiteLLM proxy.

Reading order:

- ``runtime_config``: what a worker publishes about itself (the one boundary type between workers and routers).
- ``workers/``: the registry interface and its backends, and the vLLM worker wrapper.
- ``routing/``: the LiteLLM adapter (``strategy``, ``plugin``) and the pure routing pipeline beside it.
- ``transfer/``: the engine-specific transfer metadata and the prefill call.
"""

from litellm_disagg.version import __version__

__all__ = ["__version__"]
