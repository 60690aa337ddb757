"""vLLM's NixlConnector protocol: the prefill body, the typed handle, parse and decode fields, the engine table."""

import pytest

from litellm_disagg.engines import ENGINES, UnknownEngine, client_transfer_keys, engine_for, get_engine
from litellm_disagg.engines.base import Endpoint, InvalidTransfer, TransferHandle
from litellm_disagg.engines.vllm.transfer import KVTransferParams, VllmNixlProtocol, build_prefill_body
from litellm_disagg.runtime_config import VllmNixlTransfer
from tests.kv.helpers import worker

PARAMS = {"do_remote_prefill": True, "remote_engine_id": "E", "remote_block_ids": [[1]], "remote_host": "127.0.0.1",
          "remote_port": 5600, "remote_request_id": "r1", "tp_size": 1}
"""What ``worker("p")`` (NIXL side channel 127.0.0.1:5600, no published engine id) may answer."""


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


def test_transfer_params_pass_through_verbatim():
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


# -- a prefill answer is a claim: checked against the answering worker's discovery entry, and bounded -----------------


def _published(engine_id: str | None = "engine-p", *, capacity: int = 1000):
    return worker("p", capacity=capacity).model_copy(
        update={"transfer": VllmNixlTransfer(host="127.0.0.1", port=5600, engine_id=engine_id)}
    )


def _answer(prompt_tokens: int | None = 40, **params) -> dict:
    fields = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "engine-p",
              "remote_block_ids": [[3, 4, 5]], "remote_host": "127.0.0.1", "remote_port": 5600,
              "remote_request_id": "r1", "tp_size": 1, "remote_num_tokens": 40} | params
    usage = {} if prompt_tokens is None else {"usage": {"prompt_tokens": prompt_tokens}}
    return {"choices": [], "kv_transfer_params": {k: v for k, v in fields.items() if v is not ...}} | usage


def test_an_answer_naming_the_workers_own_engine_and_side_channel_is_accepted():
    handle = VllmNixlProtocol().parse_prefill(_answer(), prefill=_published())
    assert handle.remote_engine_id == "engine-p" and handle.block_groups() == [[3, 4, 5]]
    # vLLM's data-parallel ranks suffix the configured id; a worker that publishes no engine id is checked on the rest.
    VllmNixlProtocol().parse_prefill(_answer(remote_engine_id="engine-p_dp1"), prefill=_published())
    VllmNixlProtocol().parse_prefill(_answer(remote_engine_id="anything"), prefill=_published(None))
    # Older vLLM: one flat list of block ids.
    assert VllmNixlProtocol().parse_prefill(_answer(remote_block_ids=[3, 4]), prefill=_published()).block_groups() == [[3, 4]]


HOSTILE = [
    ("another engine", {"remote_engine_id": "engine-d"}),
    ("an engine id extended past the dp suffix", {"remote_engine_id": "engine-p_dp1x"}),
    ("another host", {"remote_host": "10.6.6.6"}),
    ("another port", {"remote_port": 5601}),
    ("no side channel", {"remote_host": ...}),
    ("an unknown key", {"remote_extra": 1}),
    ("a negative block id", {"remote_block_ids": [[3, -1]]}),
    ("a bool block id", {"remote_block_ids": [[True]]}),
    ("a string block id", {"remote_block_ids": [["3"]]}),
    ("a block id beyond the published capacity", {"remote_block_ids": [[1000]]}),
    ("more blocks than the prompt fills", {"remote_block_ids": [list(range(5))]}),
    ("too many KV groups", {"remote_block_ids": [[1]] * 17}),
    ("a port that is a string", {"remote_port": "5600"}),
    ("an oversized request id", {"remote_request_id": "r" * 300}),
    ("do_remote_decode set", {"do_remote_decode": True}),
    ("more tokens than the prompt", {"remote_num_tokens": 42}),
    ("tp_size a bool", {"tp_size": True}),
]


@pytest.mark.parametrize(("case", "params"), HOSTILE, ids=[c for c, _ in HOSTILE])
def test_an_answer_the_worker_cannot_give_is_refused(case, params):
    # A 40-token prompt in blocks of 16 fills 3 blocks (+1 for the sampled token): 4 ids at most.
    with pytest.raises(InvalidTransfer):
        VllmNixlProtocol().parse_prefill(_answer(**params), prefill=_published())


def test_the_routers_own_token_count_bounds_the_blocks_before_the_answers_usage():
    # The answer claims a long prompt; the router counted 16 tokens: 2 blocks at most.
    answer = _answer(prompt_tokens=4000, remote_block_ids=[[1, 2, 3]], remote_num_tokens=None)
    VllmNixlProtocol().parse_prefill(answer, prefill=_published())
    with pytest.raises(InvalidTransfer):
        VllmNixlProtocol().parse_prefill(answer, prefill=_published(), prompt_tokens=16)
    # Nothing known about the prompt: the worker's capacity bounds it.
    unknown = _answer(prompt_tokens=None, remote_block_ids=[list(range(9))], remote_num_tokens=None)
    VllmNixlProtocol().parse_prefill(unknown, prefill=_published(capacity=9))
    with pytest.raises(InvalidTransfer):
        VllmNixlProtocol().parse_prefill(unknown, prefill=_published(capacity=8))
