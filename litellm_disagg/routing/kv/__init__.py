"""KV-aware routing: the prefix index fed by engine KV events (or the router's own decisions), block hashing,
tokenization, load scraping and the per-request remote-or-local prefill decision. ``router.KVRouter`` puts them
together as the selection pipeline's context provider.

Reading order and a configuration example: ``README.md`` in this package. Nothing is imported here: a worker process
that imports ``litellm_disagg`` never loads ZMQ or a tokenizer for nothing; import the submodule you need.
"""
