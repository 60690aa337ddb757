"""Admission: discovery entries are claims; only allowed models and hosts join, never an operator's model group."""

import litellm

from litellm_disagg.routing import deployments
from litellm_disagg.routing.admission import Admission, AdmissionSettings
from litellm_disagg.runtime_config import VllmNixlTransfer

from ..test_routing_units import w


def worker(worker_id, *, model="tiny", host="127.0.0.1", transfer_host=None):
    return w(worker_id, model=model).model_copy(update={
        "base_url": f"http://{host}:8100/v1",
        "transfer": VllmNixlTransfer(host=transfer_host or host, port=5600),
    })


def ids(configs):
    return [c.worker_id for c in configs]


def test_any_model_and_host_by_default_else_only_what_the_operator_allows(caplog):
    entries = [worker("a"), worker("b", model="llama"), worker("c", model="evil")]
    assert ids(Admission(AdmissionSettings()).admit(entries)) == ["a", "b", "c"]
    assert ids(Admission(AdmissionSettings(), model_groups={"tiny": "g", "llama": "g2"}).admit(entries)) == ["a", "b"]
    only = Admission(AdmissionSettings(allowed_models=["llama"]), model_groups={"tiny": "g"})
    caplog.clear()
    assert ids(only.admit(entries)) == ["b"]
    only.admit(entries)
    assert caplog.text.count("discovery entry c not admitted: model 'evil' is not allowed") == 1  # logged once


def test_hosts_must_lie_in_allowed_networks_or_be_listed_names():
    admission = Admission(AdmissionSettings(allowed_networks=["10.0.0.0/8", "::1/128"], allowed_hosts=["gpu-1.internal"]))
    entries = [
        worker("in", host="10.1.2.3"),
        worker("out", host="192.168.1.5"),
        worker("v6", host="[::1]", transfer_host="::1"),
        worker("named", host="gpu-1.internal", transfer_host="10.9.9.9"),
        worker("unlisted-name", host="gpu-2.internal"),
        worker("sneaky-transfer", host="10.1.2.3", transfer_host="203.0.113.7"),
    ]
    assert ids(admission.admit(entries)) == ["in", "v6", "named"]


def test_a_model_group_with_hand_made_deployments_is_never_taken_over():
    router = litellm.Router(model_list=[
        {"model_name": "tiny", "litellm_params": {"model": "openai/x", "api_key": "k"}, "model_info": {"id": "hand-1"}},
    ])
    taken = deployments.operator_groups(router)
    assert taken == {"tiny"}
    admitted = Admission(AdmissionSettings()).admit(
        [worker("a"), worker("b", model="other")], operator_group=lambda c: c.model in taken
    )
    assert ids(admitted) == ["b"]
