import pytest
from pydantic import ValidationError

from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole, WorkerState

VALID = {
    "worker_id": "prefill-a-8100",
    "model": "tiny",
    "role": "prefill",
    "base_url": "http://127.0.0.1:8100/v1",
    "nixl_host": "127.0.0.1",
    "nixl_port": 5600,
    "kv_capacity_blocks": 512,
    "block_size": 128,
    "state": "ready",
}


def test_valid_round_trip_through_json():
    config = RuntimeConfig.model_validate(VALID)
    assert config.role is WorkerRole.PREFILL and config.state is WorkerState.READY
    assert RuntimeConfig.model_validate_json(config.model_dump_json()) == config
    assert config.server_url == "http://127.0.0.1:8100"
    assert config.routable


@pytest.mark.parametrize(
    "change",
    [
        {"role": "router"},  # unknown role
        {"state": "sleeping"},
        {"nixl_port": "5600"},  # a string where a number belongs: no coercion
        {"nixl_port": 0},
        {"nixl_port": 70000},
        {"kv_capacity_blocks": -1},
        {"block_size": 0},
        {"base_url": "ftp://host/v1"},
        {"base_url": "not a url"},
        {"worker_id": "has space"},
        {"worker_id": ""},
        {"worker_id": "x" * 200},
        {"model": "m" * 1000},
    ],
)
def test_invalid_fields_are_refused(change):
    with pytest.raises(ValidationError):
        RuntimeConfig.model_validate(VALID | change)


@pytest.mark.parametrize("missing", ["worker_id", "model", "role", "base_url", "nixl_host", "nixl_port", "kv_capacity_blocks", "block_size"])
def test_missing_required_field_is_refused(missing):
    data = dict(VALID)
    del data[missing]
    with pytest.raises(ValidationError):
        RuntimeConfig.model_validate(data)


def test_unknown_fields_from_newer_workers_are_ignored():
    config = RuntimeConfig.model_validate(VALID | {"future_field": {"x": 1}})
    assert not hasattr(config, "future_field")


def test_roles_and_states():
    assert WorkerRole.BOTH.can_prefill and WorkerRole.BOTH.can_decode
    assert WorkerRole.PREFILL.can_prefill and not WorkerRole.PREFILL.can_decode
    assert not WorkerRole.DECODE.can_prefill and WorkerRole.DECODE.can_decode
    draining = RuntimeConfig.model_validate(VALID).with_state(WorkerState.DRAINING)
    assert not draining.routable
