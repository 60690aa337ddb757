"""Workers: run one engine as a discoverable, drainable litellm-disagg worker.

Reading order: ``lifecycle`` (publish READY, heartbeat, drain, withdraw: what every worker does in discovery, the
vLLM wrapper and the simulated worker alike), ``vllm_command`` (what command line a role gets), ``engine_probe`` (what
a running engine reports about itself), ``wrapper`` (the vLLM worker: start the engine, wait until it is healthy, then
the lifecycle). Discovery itself (the ``Registry`` interface and its backends) is ``litellm_disagg.discovery``.
"""
