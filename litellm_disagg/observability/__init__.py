"""Observability: metrics, traces, and the operator's terminal view. Imports nothing: each part is loaded only when
used (tracing only when turned on).
"""
