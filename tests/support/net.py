"""Ports and HTTP helpers for tests (127.0.0.1 only)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from litellm_disagg.ports import free_port

__all__ = ["free_port", "metric", "metrics"]


def metrics(server_url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(f"{server_url}/metrics", timeout=10).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def metric(server_url: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for lab, v in metrics(server_url).get(name, []) if all(lab.get(k) == want for k, want in labels.items()))
