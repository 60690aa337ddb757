"""Keep a LiteLLM router's deployments in step with the worker pool.

Every ready decode-capable worker is one deployment of its model group; prefill-only workers are not deployments
(the orchestrator calls them directly). Deployments this module creates carry ``model_info.litellm_disagg`` and an id
with a fixed prefix, so deployments the operator configured by hand are never touched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from litellm.types.router import Deployment

from litellm_disagg.engines import engine_for
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.runtime_config import RuntimeConfig

logger = logging.getLogger(__name__)

ID_PREFIX = "litellm-disagg/"
INFO_KEY = "litellm_disagg"


def deployment_id(worker_id: str) -> str:
    return f"{ID_PREFIX}{worker_id}"


def worker_id_of(deployment: dict[str, Any] | Deployment) -> str | None:
    """The worker behind a deployment this module created, else None."""
    info = deployment.get("model_info") if isinstance(deployment, dict) else deployment.model_info
    deployment_id_ = (info or {}).get("id") if isinstance(info, dict) else getattr(info, "id", None)
    if isinstance(deployment_id_, str) and deployment_id_.startswith(ID_PREFIX):
        return deployment_id_[len(ID_PREFIX) :]
    return None


def deployment_for(worker: RuntimeConfig, model_group: str, *, api_key: str | None = None) -> dict[str, Any]:
    return {
        "model_name": model_group,
        "litellm_params": {
            "model": f"{engine_for(worker).adapter.provider_prefix}/{worker.model}",
            "api_base": worker.base_url,
            "api_key": api_key or "none",
        },
        "model_info": {
            "id": deployment_id(worker.worker_id),
            INFO_KEY: {"worker_id": worker.worker_id, "role": worker.role.value, "served_model": worker.model},
        },
    }


def desired_deployments(
    pool: WorkerPool, model_group: Callable[[str], str], *, api_key: str | None = None
) -> dict[str, dict[str, Any]]:
    """``api_key``: the workers' key (``worker_auth``), sent by LiteLLM's decode call."""
    return {
        deployment_id(w.worker_id): deployment_for(w, model_group(w.model), api_key=api_key)
        for w in pool.workers
        if w.routable and w.role.can_decode
    }


def reconcile(router: Any, desired: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Make the router's disagg deployments exactly ``desired``. Returns (added or updated ids, removed ids)."""
    present = {i for i in router.get_model_ids() if i.startswith(ID_PREFIX)}
    changed: list[str] = []
    for dep_id, deployment in desired.items():
        current = router.get_deployment(model_id=dep_id)
        if current is not None and _same(current, deployment):
            continue
        router.upsert_deployment(Deployment(**deployment))
        changed.append(dep_id)
    removed = sorted(present - desired.keys())
    for dep_id in removed:
        router.delete_deployment(id=dep_id)
    if changed or removed:
        logger.info("deployments: added/updated %s, removed %s", changed, removed)
    return changed, removed


def _same(current: Deployment, wanted: dict[str, Any]) -> bool:
    """Everything this module writes, the worker's role included: a worker that moves decode -> both (or any other
    role change that keeps it decode-capable) keeps its address, and its deployment must still show the new role."""
    params = current.litellm_params
    info = current.model_info
    current_info = info.get(INFO_KEY) if isinstance(info, dict) else getattr(info, INFO_KEY, None)
    return (
        current.model_name == wanted["model_name"]
        and params.api_base == wanted["litellm_params"]["api_base"]
        and params.model == wanted["litellm_params"]["model"]
        and params.api_key == wanted["litellm_params"]["api_key"]
        and current_info == wanted["model_info"][INFO_KEY]
    )


def operator_groups(router: Any) -> frozenset[str]:
    """Model groups with deployments the operator configured (not made by this module): discovery never joins them."""
    groups = set()
    for deployment in getattr(router, "model_list", None) or []:
        if worker_id_of(deployment) is None:
            name = deployment.get("model_name") if isinstance(deployment, dict) else getattr(deployment, "model_name", None)
            if isinstance(name, str):
                groups.add(name)
    return frozenset(groups)
