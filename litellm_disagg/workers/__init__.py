"""Workers: run one vLLM engine as a discoverable, drainable litellm-disagg worker.

Reading order: ``vllm_command`` (what command line a role gets), ``engine_probe`` (what a running engine reports about
itself), ``wrapper`` (the lifecycle: start, register, heartbeat, drain, stop). Discovery itself (the ``Registry``
interface and its backends) is ``litellm_disagg.discovery``.
"""
