"""Workers: discovery (the ``Registry`` interface and its backends) and the vLLM worker wrapper.

Reading order: ``registry`` (the interface), ``file_registry`` (the embedded default backend), ``consul_registry``
(the cluster backend, built from ``consul_endpoint``, ``consul_http``, ``consul_codec``, ``consul_reader``,
``consul_watch`` and ``discovery_status``), ``registry_factory`` and ``registry_cli``, then ``vllm_command`` (what command line a role gets), ``engine_probe`` (what a running engine reports about
itself), ``wrapper`` (the lifecycle: start, register, heartbeat, drain, stop).
"""
