"""Serving benchmark: routing strategies compared through the real LiteLLM proxy on the same workers and workload.

    .venv/bin/python -m bench.serving --backend sim  --workload multi-turn      # simulated workers (8 by default)
    .venv/bin/python -m bench.serving --backend vllm --workload multi-turn      # real vLLM CPU workers (SmolLM2)

Modules, in the order data flows: ``workloads`` (seeded sessions of chat turns), ``workers`` (start the workers,
reset their prefix caches, read their metrics), ``arms`` (one proxy config per routing strategy), ``proxy`` (start
and stop ``litellm --config``), ``loadgen`` (send the sessions, time every streamed token), ``report`` (figures,
table, JSON, PNG), ``cli`` (the run directory and workload shape from the parsed arguments), ``__main__`` (the
command); ``replicas`` and ``pd`` are further commands on the same parts. Where each request's TTFT went:
``trace_source`` reads the workers' per-request traces (the simulator's request log, or real vLLM workers'
OpenTelemetry spans received by ``engine_traces``), ``breakdown`` joins them with the client's timings, and
``breakdown_plot`` draws the parts' means from the JSON.
"""
