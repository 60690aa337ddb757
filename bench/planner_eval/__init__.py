"""Does disaggregation pay, and does the planner beat a static split? A discrete-event evaluation in simulated time.

Reading order:

1. ``workload.py``: the phases (prompt-heavy, generation-heavy, bursts) and their seeded arrival schedules.
2. ``engine.py``: one simulated worker (continuous batching over a block-counted KV cache, the timing model of
   ``litellm_disagg/sim/timing.py``), pure, no clock of its own.
3. ``routing.py``: the product's selection pipeline (filters, scorers, picker) driven with the simulated loads.
4. ``cluster.py``: the event loop: arrivals, steps, KV transfers, role flips, planner ticks.
5. ``signals.py``: ``ClusterSignals`` (the planner's input type) computed from the simulated state.
6. ``policies.py``: the arms' role policies: fixed splits, and the planner (``litellm_disagg.planner``).
7. ``slo.py``, ``goodput.py``: SLO attainment, and goodput as DistServe defines it (highest rate with >= 90% of
   requests meeting both the TTFT and the ITL target), by bisection over the rate.
8. ``report.py``, ``plots.py``, ``__main__.py``: the tables, the PNGs, the command.

``python -m bench.planner_eval`` runs it; ``docs/planner-evaluation.md`` has the figures and the exact command.
"""
