"""Soak benchmark: load and faults together over simulated workers.

``harness`` runs the load and the faults and counts what happened (``tests/test_soak.py`` asserts on it); ``__main__``
is the command, which prints the counts and latencies and plots them::

    .venv/bin/python -m bench.soak [--requests 1000] [--concurrency 300]
"""
