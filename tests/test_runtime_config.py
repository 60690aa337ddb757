import json

import pytest
from pydantic import ValidationError

from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole, WorkerState
from tests.support.runtime_config_0_1 import RuntimeConfig as RuntimeConfig01

VALID = {
    "worker_id": "prefill-a-8100",
    "model": "tiny",
    "role": "prefill",
    "engine": "vllm",
    "base_url": "http://127.0.0.1:8100/v1",
    "transfer": {"kind": "vllm-nixl", "host": "127.0.0.1", "port": 5600},
    "kv_capacity_blocks": 512,
    "block_size": 128,
    "state": "ready",
}

LEGACY = {
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
"""What tests built in 0.1 (top-level nixl_host/nixl_port, no transfer section)."""

LEGACY_JSON = (
    '{"worker_id":"prefill-a-8100","model":"tiny","role":"prefill","backend":"vllm",'
    '"base_url":"http://127.0.0.1:8100/v1","nixl_host":"127.0.0.1","nixl_port":5600,"kv_capacity_blocks":512,'
    '"block_size":128,"kv_events_endpoint":"tcp://127.0.0.1:5557","tensor_parallel_size":1,"state":"ready",'
    '"started_at":1700000000.5,"version":"0.1.0"}'
)
"""An entry exactly as a 0.1 worker wrote it (``model_dump_json`` of its RuntimeConfig)."""


def test_valid_round_trip_through_json():
    config = RuntimeConfig.model_validate(VALID)
    assert config.role is WorkerRole.PREFILL and config.state is WorkerState.READY
    assert config.engine == "vllm" and config.transfer == VllmNixlTransfer(host="127.0.0.1", port=5600)
    assert RuntimeConfig.model_validate_json(config.model_dump_json()) == config
    assert RuntimeConfig.model_validate(config.model_dump()) == config
    assert config.server_url == "http://127.0.0.1:8100"
    assert config.routable


@pytest.mark.parametrize(
    "change",
    [
        {"role": "router"},  # unknown role
        {"state": "sleeping"},
        {"engine": "sglang"},  # an engine this version does not know
        {"transfer": {"kind": "sglang-bootstrap", "host": "127.0.0.1", "port": 5600}},
        {"transfer": {"host": "127.0.0.1", "port": 5600}},  # no kind
        {"transfer": {"kind": "vllm-nixl", "host": "127.0.0.1", "port": "5600"}},  # no coercion
        {"transfer": {"kind": "vllm-nixl", "host": "127.0.0.1", "port": 0}},
        {"transfer": {"kind": "vllm-nixl", "host": "127.0.0.1", "port": 70000}},
        {"transfer": {"kind": "vllm-nixl", "host": "", "port": 5600}},
        {"transfer": "127.0.0.1:5600"},
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


@pytest.mark.parametrize(
    "missing", ["worker_id", "model", "role", "base_url", "transfer", "kv_capacity_blocks", "block_size"]
)
def test_missing_required_field_is_refused(missing):
    data = dict(VALID)
    del data[missing]
    with pytest.raises(ValidationError):
        RuntimeConfig.model_validate(data)


def test_unknown_fields_from_newer_workers_are_ignored():
    config = RuntimeConfig.model_validate(VALID | {"future_field": {"x": 1}})
    assert not hasattr(config, "future_field")
    transfer = VALID["transfer"] | {"future_field": 1}
    assert RuntimeConfig.model_validate(VALID | {"transfer": transfer}).transfer.port == 5600


def test_roles_and_states():
    assert WorkerRole.BOTH.can_prefill and WorkerRole.BOTH.can_decode
    assert WorkerRole.PREFILL.can_prefill and not WorkerRole.PREFILL.can_decode
    assert not WorkerRole.DECODE.can_prefill and WorkerRole.DECODE.can_decode
    draining = RuntimeConfig.model_validate(VALID).with_state(WorkerState.DRAINING)
    assert not draining.routable


# -- compatibility with 0.1 (remove with the compatibility code) -----------------------------------------------------


def test_a_0_1_entry_reads_into_the_transfer_section():
    at = {"started_at": 1.0}
    assert RuntimeConfig.model_validate(LEGACY | at) == RuntimeConfig.model_validate(VALID | at)
    old = RuntimeConfig.model_validate_json(LEGACY_JSON)
    assert old.engine == "vllm" and old.transfer == VllmNixlTransfer(host="127.0.0.1", port=5600)
    assert (old.kv_events_endpoint, old.started_at, old.version) == ("tcp://127.0.0.1:5557", 1700000000.5, "0.1.0")
    assert RuntimeConfig.model_validate(json.loads(LEGACY_JSON)) == old


@pytest.mark.parametrize(
    "change",
    [{"nixl_port": "5600"}, {"nixl_port": 0}, {"nixl_port": 70000}, {"nixl_host": ""}, {"backend": "sglang"}],
)
def test_a_0_1_entry_is_validated_as_strictly(change):
    with pytest.raises(ValidationError):
        RuntimeConfig.model_validate(LEGACY | change)


@pytest.mark.parametrize("missing", ["nixl_host", "nixl_port"])
def test_a_0_1_entry_without_its_nixl_endpoint_is_refused(missing):
    data = dict(LEGACY)
    del data[missing]
    with pytest.raises(ValidationError):
        RuntimeConfig.model_validate(data)


def test_a_new_entry_still_reads_in_a_0_1_router():
    config = RuntimeConfig.model_validate_json(LEGACY_JSON)
    written = json.loads(config.model_dump_json())
    assert written["transfer"] == {"kind": "vllm-nixl", "host": "127.0.0.1", "port": 5600}
    assert (written["backend"], written["nixl_host"], written["nixl_port"]) == ("vllm", "127.0.0.1", 5600)
    assert config.model_dump(mode="json") == written
    old = RuntimeConfig01.model_validate_json(config.model_dump_json())
    assert RuntimeConfig01.model_validate_json(LEGACY_JSON) == old
    assert (old.nixl_host, old.nixl_port, old.backend) == ("127.0.0.1", 5600, "vllm")


def test_the_transfer_section_wins_over_leftover_legacy_keys():
    config = RuntimeConfig.model_validate(VALID | {"nixl_host": "10.9.9.9", "nixl_port": 1, "backend": "vllm"})
    assert config.transfer == VllmNixlTransfer(host="127.0.0.1", port=5600)
