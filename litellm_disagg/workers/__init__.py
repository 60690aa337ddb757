"""Workers: discovery (the ``Registry`` interface and its backends) and the vLLM worker wrapper.

Reading order: ``registry`` (the interface), ``file_registry`` (the embedded default backend), ``registry_factory``,
then ``vllm_command`` (what command line a role gets), ``engine_probe`` (what a running engine reports about
itself), ``wrapper`` (the lifecycle: start, register, heartbeat, drain, stop).
"""
