"""One pool's selection: filters -> scorers -> picker, over a scoring context from a context provider.

Reading order: ``context.py`` (what scorers see), ``filters.py``, ``scorers/`` (one file each, and the table),
``profile.py`` (weights per pool, presets), ``picker.py``, ``selection.py`` (the result), ``pipeline.py`` (the
stages together), ``providers.py`` (where the context comes from: load only, or KV-aware).
"""
