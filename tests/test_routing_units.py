"""The pool and the deployment reconciliation, as units (the selection pipeline: tests/routing/)."""

import litellm

from litellm_disagg.routing import deployments
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.runtime_config import RuntimeConfig

from .test_runtime_config import VALID


def w(worker_id, role="decode", state="ready", model="tiny", port=8100):
    return RuntimeConfig.model_validate(VALID | {"worker_id": worker_id, "role": role, "state": state, "model": model, "base_url": f"http://127.0.0.1:{port}/v1"})


def test_pool_candidates_by_role_state_and_model():
    pool = WorkerPool.of([w("p1", "prefill"), w("p2", "prefill", "draining"), w("b1", "both"), w("d1"), w("d2", model="other")])
    assert [x.worker_id for x in pool.prefill_candidates("tiny")] == ["b1", "p1"]
    assert [x.worker_id for x in pool.prefill_candidates("tiny", exclude=["b1"])] == ["p1"]
    assert [x.worker_id for x in pool.decode_candidates("tiny")] == ["b1", "d1"]
    assert pool.get("d2").model == "other" and pool.get("nope") is None


def test_reconcile_adds_updates_and_removes_only_its_own_deployments():
    router = litellm.Router(model_list=[{"model_name": "hand", "litellm_params": {"model": "openai/x", "api_key": "k"}, "model_info": {"id": "hand-1"}}])
    pool = WorkerPool.of([w("d1", port=8101), w("p1", "prefill", port=8102), w("d2", "decode", "draining", port=8103)])
    added, removed = deployments.reconcile(router, deployments.desired_deployments(pool, lambda m: f"group-{m}"))
    assert added == ["litellm-disagg/d1"] and removed == []
    dep = router.get_deployment(model_id="litellm-disagg/d1")
    assert dep.model_name == "group-tiny" and dep.litellm_params.api_base == "http://127.0.0.1:8101/v1"
    assert dep.litellm_params.model == "hosted_vllm/tiny"
    # Unchanged: nothing to do. Moved: updated. Gone: removed. The hand-made deployment stays.
    assert deployments.reconcile(router, deployments.desired_deployments(pool, lambda m: f"group-{m}")) == ([], [])
    moved = WorkerPool.of([w("d1", port=9999)])
    assert deployments.reconcile(router, deployments.desired_deployments(moved, lambda m: f"group-{m}"))[0] == ["litellm-disagg/d1"]
    assert router.get_deployment(model_id="litellm-disagg/d1").litellm_params.api_base == "http://127.0.0.1:9999/v1"
    assert deployments.reconcile(router, {}) == ([], ["litellm-disagg/d1"])
    assert router.get_model_ids() == ["hand-1"]


def test_reconcile_follows_every_role_change_of_a_decode_capable_worker():
    """A worker keeps its address when its role moves (planner, ``litellm-disagg role``): the deployment's
    ``model_info`` must still show the role it has now, not the one it was first added with."""
    router = litellm.Router(model_list=[])

    def sync(role):
        desired = deployments.desired_deployments(WorkerPool.of([w("x1", role, port=8111)]), lambda m: m)
        return deployments.reconcile(router, desired)

    def role_on_router():
        dep = router.get_deployment(model_id="litellm-disagg/x1")
        return None if dep is None else dep.model_info[deployments.INFO_KEY]["role"]

    assert sync("decode") == (["litellm-disagg/x1"], []) and role_on_router() == "decode"
    assert sync("both") == (["litellm-disagg/x1"], []) and role_on_router() == "both"
    assert sync("both") == ([], [])  # unchanged: nothing to do
    assert sync("decode") == (["litellm-disagg/x1"], []) and role_on_router() == "decode"
    assert sync("prefill") == ([], ["litellm-disagg/x1"]) and role_on_router() is None  # prefill-only: no deployment
    assert sync("both") == (["litellm-disagg/x1"], []) and role_on_router() == "both"


def test_reconcile_follows_a_changed_worker_key():
    router = litellm.Router(model_list=[])
    pool = WorkerPool.of([w("x1", port=8112)])
    deployments.reconcile(router, deployments.desired_deployments(pool, lambda m: m, api_key="sk-old"))
    changed, _ = deployments.reconcile(router, deployments.desired_deployments(pool, lambda m: m, api_key="sk-new"))
    assert changed == ["litellm-disagg/x1"]
    assert router.get_deployment(model_id="litellm-disagg/x1").litellm_params.api_key == "sk-new"
