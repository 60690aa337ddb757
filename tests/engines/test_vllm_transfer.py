"""vLLM's NixlConnector protocol: the prefill body, the typed handle, parse and decode fields, the engine table."""

import pytest

from litellm_disagg.engines import ENGINES, UnknownEngine, client_transfer_keys, engine_for, get_engine
from litellm_disagg.engines.base import Endpoint, InvalidTransfer, TransferHandle
from litellm_disagg.engines.vllm.transfer import KVTransferParams, VllmNixlProtocol, build_prefill_body
from tests.kv.helpers import worker

PARAMS = {"do_remote_prefill": True, "remote_engine_id": "E", "remote_block_ids": [[1]], "remote_host": "h",
          "remote_port": 1, "remote_request_id": "r1", "tp_size": 1, "some_future_field": {"x": [1]}}


def test_chat_prefill_body_keeps_the_prompt_and_forces_one_token():
    request = {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "max_tokens": 500,
        "max_completion_tokens": 500,
        "stream": True,
        "stream_options": {"include_usage": True},
        "min_tokens": 10,
        "temperature": 0.7,
        "n": 1,
        "user": "someone",
    }
    body = build_prefill_body(Endpoint.CHAT, "tiny", request)
    assert body == {
        "model": "tiny",
        "messages": request["messages"],
        "tools": request["tools"],
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True},
    }


def test_completion_prefill_body():
    body = build_prefill_body(Endpoint.COMPLETIONS, "tiny", {"prompt": "abc", "max_tokens": 9, "stream": True})
    assert body == {"model": "tiny", "prompt": "abc", "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}


def test_transfer_params_pass_through_verbatim_including_unknown_fields():
    raw = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e", "remote_block_ids": [[1, 2]],
           "remote_host": "h", "remote_port": 5, "tp_size": 1, "remote_num_tokens": 352, "transfer_mode": "pull",
           "remote_blocks_expiry_time": None}
    params = KVTransferParams.model_validate(raw)
    assert params.usable
    assert params.for_decode() == raw


def test_params_without_remote_prefill_are_not_usable():
    assert not KVTransferParams.model_validate({"do_remote_prefill": False}).usable
    assert not KVTransferParams.model_validate({"do_remote_prefill": True}).usable


def test_the_protocol_builds_parses_and_hands_over_verbatim():
    protocol, p, d = VllmNixlProtocol(), worker("p"), worker("d")
    body = protocol.prefill_body(Endpoint.CHAT, "tiny", {"messages": [], "max_tokens": 9}, prefill=p, decode=d)
    assert body == build_prefill_body(Endpoint.CHAT, "tiny", {"messages": [], "max_tokens": 9})
    handle = protocol.parse_prefill({"choices": [], "kv_transfer_params": PARAMS}, prefill=p)
    assert isinstance(handle, KVTransferParams) and isinstance(handle, TransferHandle)
    assert handle.protocol == protocol.name == p.transfer.kind
    assert protocol.decode_fields(handle) == {"kv_transfer_params": PARAMS}
    assert not protocol.concurrent and protocol.client_keys == ("kv_transfer_params",)


@pytest.mark.parametrize(
    "payload",
    [
        {"choices": []},
        {"kv_transfer_params": None},
        {"kv_transfer_params": "garbage"},
        {"kv_transfer_params": {"do_remote_prefill": "maybe", "remote_engine_id": "E"}},
        {"kv_transfer_params": {"do_remote_prefill": False, "remote_engine_id": "E"}},
        {"kv_transfer_params": {"do_remote_prefill": True}},
        ["not", "an", "object"],
        None,
    ],
)
def test_unusable_prefill_answers_raise_invalid_transfer(payload):
    with pytest.raises(InvalidTransfer):
        VllmNixlProtocol().parse_prefill(payload, prefill=worker("p"))
    assert issubclass(InvalidTransfer, ValueError)


def test_a_foreign_handle_is_refused():
    class Other(TransferHandle):
        protocol = "other"

    with pytest.raises(TypeError):
        VllmNixlProtocol().decode_fields(Other())


def test_engine_table_is_read_only_and_finds_a_workers_engine():
    vllm = get_engine("vllm")
    assert engine_for(worker("w")) is vllm and set(ENGINES) == {"vllm", "sglang", "trtllm"}
    assert vllm.adapter.provider_prefix == "hosted_vllm"
    assert vllm.transfer.name == "vllm-nixl"
    with pytest.raises(TypeError):
        ENGINES["other"] = vllm  # type: ignore[index]
    with pytest.raises(UnknownEngine):
        get_engine("tgi")


def test_client_transfer_keys_cover_every_engine():
    keys = client_transfer_keys()
    assert isinstance(keys, frozenset) and "kv_transfer_params" in keys
    assert all(set(engine.transfer.client_keys) <= keys for engine in ENGINES.values())
