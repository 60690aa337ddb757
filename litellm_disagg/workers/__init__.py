"""Workers: run one engine as a discoverable, drainable litellm-disagg worker.

Reading order: ``lifecycle`` (publish READY, heartbeat, drain, withdraw: what every worker does in discovery, the
vLLM wrapper and the simulated worker alike), ``engine_probe`` (what a running engine reports about itself, under its
adapter's metric names), ``wrapper`` (the worker: start the engine with the command line its adapter gives
(``litellm_disagg.engines``), wait until it is healthy, then the lifecycle). Discovery itself (the ``Registry``
interface and its backends) is ``litellm_disagg.discovery``.
"""
