"""The workers' API key on the proxy side: where it comes from, who is admitted, what carries it (never its repr)."""

import pytest

from litellm_disagg.routing import deployments
from litellm_disagg.routing.admission import Admission, AdmissionSettings
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.worker_auth import WorkerAuthSettings, WorkerKey, load_worker_key, read_key_file
from litellm_disagg.settings import DisaggSettings

from ..test_routing_units import w


def test_the_key_comes_from_a_file_else_an_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("LITELLM_DISAGG_WORKER_API_KEY", "from-env")
    assert load_worker_key(WorkerAuthSettings()).value == "from-env"
    monkeypatch.setenv("OTHER_KEY_VAR", "other")
    assert load_worker_key(WorkerAuthSettings(api_key_env="OTHER_KEY_VAR")).value == "other"
    (tmp_path / "key").write_text("  from-file\n")
    assert load_worker_key(WorkerAuthSettings(api_key_file=str(tmp_path / "key"))).value == "from-file"
    monkeypatch.delenv("LITELLM_DISAGG_WORKER_API_KEY")
    assert not load_worker_key(WorkerAuthSettings())
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError):
        read_key_file(tmp_path / "empty")
    assert DisaggSettings.model_validate({"worker_auth": {"api_key_file": "/run/secrets/k"}}).worker_auth.api_key_file


def test_the_key_is_sent_but_never_shown():
    key = WorkerKey("sk-secret")
    assert key.headers() == {"Authorization": "Bearer sk-secret"}
    assert "sk-secret" not in repr(key) and "sk-secret" not in str(key)
    assert WorkerKey().headers() == {}


def test_a_worker_that_requires_a_key_is_admitted_only_by_a_proxy_that_has_one(caplog):
    keyed = w("k").model_copy(update={"api_key_required": True})
    entries = [keyed, w("open")]
    assert [c.worker_id for c in Admission(AdmissionSettings()).admit(entries)] == ["open"]
    assert "discovery entry k not admitted: it requires an API key" in caplog.text
    assert [c.worker_id for c in Admission(AdmissionSettings(), worker_key=True).admit(entries)] == ["k", "open"]


def test_litellms_decode_call_carries_the_key():
    pool = WorkerPool.of([w("d1")])
    [deployment] = deployments.desired_deployments(pool, lambda m: m, api_key="sk-secret").values()
    assert deployment["litellm_params"]["api_key"] == "sk-secret"
    [open_] = deployments.desired_deployments(pool, lambda m: m).values()
    assert open_["litellm_params"]["api_key"] == "none"
