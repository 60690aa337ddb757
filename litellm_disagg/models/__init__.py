"""Models that need no download: a tiny generated Llama (tests) and SmolLM2-135M-Instruct from a PyPI wheel (``up``)."""
