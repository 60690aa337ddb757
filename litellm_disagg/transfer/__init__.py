"""Transfer: the engine-specific metadata that moves a prompt's KV cache from prefill to decode, and the prefill call.

- ``vllm``: vLLM NixlConnector's ``kv_transfer_params`` (typed) and how a prefill request is derived from a client
  request.
- ``prefill``: the HTTP call to a prefill worker, with its error classes.
"""
