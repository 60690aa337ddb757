"""SGLang's bootstrap protocol and TensorRT-LLM's disaggregated_params: bodies, handles, decode fields, launch, and
the transfer sections workers publish (strict, discriminated by kind, paired with their engine)."""

import json

import pytest
from pydantic import ValidationError

from litellm_disagg.discovery.consul.codec import decode_meta, encode
from litellm_disagg.engines import client_transfer_keys, get_engine
from litellm_disagg.engines.base import Endpoint, InvalidTransfer, LaunchSpec
from litellm_disagg.engines.sglang.transfer import MAX_ROOM, BootstrapTicket, SglangBootstrapProtocol, open_ticket
from litellm_disagg.engines.trtllm.transfer import DisaggregatedParams, TrtllmDisaggProtocol, build_context_body
from litellm_disagg.routing.request import strip_transfer_params
from litellm_disagg.runtime_config import (
    RuntimeConfig,
    SglangBootstrapTransfer,
    TrtllmDisaggTransfer,
    VllmNixlTransfer,
    WorkerRole,
)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "temperature": 0.5, "stream": True,
        "stream_options": {"include_usage": True}}


def config(worker_id: str, engine: str, transfer, role: str = "prefill") -> RuntimeConfig:
    return RuntimeConfig(worker_id=worker_id, model="m", role=role, engine=engine, base_url=f"http://{worker_id}:8000/v1",
                         transfer=transfer, kv_capacity_blocks=0, block_size=1)


SG_P = config("p", "sglang", SglangBootstrapTransfer(host="10.0.0.7", port=8998))
SG_D = config("d", "sglang", SglangBootstrapTransfer(host="10.0.0.8", port=8998), "decode")
TR_P = config("p", "trtllm", TrtllmDisaggTransfer())
TR_D = config("d", "trtllm", TrtllmDisaggTransfer(), "decode")


# -- SGLang ------------------------------------------------------------------------------------------------------------


def test_sglang_opens_a_fresh_room_on_the_prefill_workers_bootstrap_server():
    protocol = SglangBootstrapProtocol()
    assert protocol.concurrent
    a = protocol.open_transfer(prefill=SG_P, decode=SG_D, request_id="r1")
    b = protocol.open_transfer(prefill=SG_P, decode=SG_D, request_id="r1")
    assert (a.host, a.port) == ("10.0.0.7", 8998) and 0 <= a.room <= MAX_ROOM
    assert a.room != b.room and a.rid != b.rid  # a retry gets a new room, and so a new rid


def test_sglang_prefill_and_decode_carry_the_same_triple():
    protocol = SglangBootstrapProtocol()
    ticket = open_ticket(SG_P, "r1", room=42)
    body = protocol.prefill_body(Endpoint.CHAT, "served", CHAT, prefill=SG_P, decode=SG_D, handle=ticket)
    assert body == {"messages": CHAT["messages"], "max_tokens": 50, "temperature": 0.5, "model": "served",
                    "stream": False, "bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 42}
    fields = protocol.decode_fields(ticket)
    assert fields == {"bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 42, "rid": ticket.rid}
    assert protocol.abort_decode(ticket) == ("abort_request", {"rid": ticket.rid})
    assert protocol.parse_prefill({"choices": [{"index": 0}]}, prefill=SG_P, handle=ticket) is ticket
    with pytest.raises(InvalidTransfer):
        protocol.parse_prefill({"error": "x"}, prefill=SG_P, handle=ticket)


def test_sglang_rooms_must_fit_63_bits_and_need_a_bootstrap_section():
    with pytest.raises(ValueError):
        BootstrapTicket("h", 1, 2**63, "r")
    with pytest.raises(InvalidTransfer):
        open_ticket(config("v", "vllm", VllmNixlTransfer(host="h", port=1)), "r1")


def test_sglang_launch_per_role():
    spec = dict(model="/m", served_model_name="s", host="0.0.0.0", port=30000, transfer_host="10.0.0.7",
                transfer_port=8998, device="gpu")
    adapter = get_engine("sglang").adapter
    prefill = adapter.launch(LaunchSpec(role=WorkerRole.PREFILL, **spec), python="py", base_env={})
    argv = list(prefill.argv)
    assert argv[:3] == ["py", "-m", "sglang.launch_server"]
    assert argv[argv.index("--disaggregation-mode") + 1] == "prefill"
    assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "nixl"
    assert argv[argv.index("--disaggregation-bootstrap-port") + 1] == "8998"
    assert prefill.transfer == SglangBootstrapTransfer(host="10.0.0.7", port=8998)
    decode = list(adapter.launch(LaunchSpec(role=WorkerRole.DECODE, kv_events_port=5557, **spec), base_env={}).argv)
    assert decode[decode.index("--disaggregation-mode") + 1] == "decode" and "--disaggregation-bootstrap-port" not in decode
    assert json.loads(decode[decode.index("--kv-events-config") + 1])["endpoint"] == "tcp://*:5557"
    both = list(adapter.launch(LaunchSpec(role=WorkerRole.BOTH, **spec), base_env={}).argv)
    assert both[both.index("--disaggregation-mode") + 1] == "null"


# -- TensorRT-LLM ------------------------------------------------------------------------------------------------------

CTX_PARAMS = {"request_type": "context_only", "first_gen_tokens": [7], "ctx_request_id": 5,
              "encoded_opaque_state": "c3RhdGU=", "draft_tokens": None, "ctx_dp_rank": 0, "future_field": [1]}


def test_trtllm_context_body():
    body = build_context_body(Endpoint.CHAT, "served", CHAT | {"max_completion_tokens": 9, "disaggregated_params": {"x": 1}})
    assert body["disaggregated_params"] == {"request_type": "context_only"}
    assert body["max_tokens"] == 1 and body["max_completion_tokens"] == 1 and body["stream"] is False
    assert "stream_options" not in body and body["model"] == "served" and body["temperature"] == 0.5


def test_trtllm_generation_carries_the_context_params_back_verbatim():
    protocol = TrtllmDisaggProtocol()
    assert not protocol.concurrent and protocol.open_transfer(prefill=TR_P, decode=TR_D, request_id="r") is None
    handle = protocol.parse_prefill({"choices": [{"index": 0, "disaggregated_params": CTX_PARAMS}]}, prefill=TR_P)
    assert isinstance(handle, DisaggregatedParams)
    assert protocol.decode_fields(handle) == {"disaggregated_params": CTX_PARAMS | {"request_type": "generation_only"}}
    assert protocol.abort_decode(handle) is None


@pytest.mark.parametrize("payload", [
    {"choices": []},
    {"choices": [{"index": 0}]},
    {"choices": [{"index": 0, "disaggregated_params": CTX_PARAMS | {"encoded_opaque_state": None}}]},
    {"choices": [{"index": 0, "disaggregated_params": CTX_PARAMS | {"request_type": "generation_only"}}]},
    {"choices": [{"index": 0, "disaggregated_params": "nope"}]},
    [1, 2],
])
def test_trtllm_unusable_context_answers(payload):
    with pytest.raises(InvalidTransfer):
        TrtllmDisaggProtocol().parse_prefill(payload, prefill=TR_P)


def test_trtllm_launch_writes_its_options_file_through_the_worker():
    spec = LaunchSpec(model="/m", served_model_name="s", role=WorkerRole.PREFILL, host="0.0.0.0", port=8001,
                      transfer_host="10.0.0.7", transfer_port=1, device="gpu")
    launch = get_engine("trtllm").adapter.launch(spec, base_env={})
    argv = list(launch.argv)
    path = argv[argv.index("--extra_llm_api_options") + 1]
    options = json.loads(launch.files[path])
    assert argv[:2] == ["trtllm-serve", "/m"] and options["cache_transceiver_config"] == {"backend": "NIXL"}
    assert options["disable_overlap_scheduler"] is True and launch.kv_events_endpoint is None
    assert get_engine("trtllm").adapter.metrics.path == "prometheus/metrics"


# -- what workers publish ----------------------------------------------------------------------------------------------


def test_transfer_sections_are_strict_and_fit_their_engine():
    assert SG_P.transfer.kind == "sglang-bootstrap" and TR_P.transfer.kind == "trtllm-disagg"
    with pytest.raises(ValidationError):  # engine and transfer kind must match
        config("x", "vllm", SglangBootstrapTransfer(host="h", port=1))
    with pytest.raises(ValidationError):
        config("x", "sglang", TrtllmDisaggTransfer())
    raw = SG_P.model_dump(mode="json")
    with pytest.raises(ValidationError):  # strict: no port from a string
        RuntimeConfig.model_validate(raw | {"transfer": raw["transfer"] | {"port": "8998"}})
    for cfg in (SG_P, TR_P):
        assert RuntimeConfig.model_validate_json(cfg.model_dump_json()) == cfg
        assert "nixl_host" not in cfg.model_dump(mode="json")  # the 0.1 keys are vLLM's only


def test_consul_meta_round_trips_the_new_sections():
    for cfg in (SG_P, TR_P):
        encoded = encode(cfg, kv_prefix="ld")
        assert encoded.kv is None and decode_meta(encoded.meta) == cfg


def test_client_keys_of_every_engine_are_stripped():
    assert {"bootstrap_room", "bootstrap_host", "bootstrap_port", "rid", "disaggregated_params"} <= client_transfer_keys()
    data = {"model": "m", "bootstrap_room": 1, "extra_body": {"disaggregated_params": {"request_type": "generation_only"}}}
    assert sorted(strip_transfer_params(data)) == ["bootstrap_room", "extra_body.disaggregated_params"]
    assert data == {"model": "m", "extra_body": {}}


def test_prefill_bodies_carry_only_openai_fields():
    # LiteLLM's call kwargs hold clients, headers and bookkeeping: none of it may reach a prefill body (not JSON).
    fields = CHAT | {"client": object(), "extra_headers": {"x": "y"}, "model": "group", "seed": 3, "top_k": 5}
    ticket = open_ticket(SG_P, "r1", room=1)
    sg = SglangBootstrapProtocol().prefill_body(Endpoint.CHAT, "served", fields, prefill=SG_P, decode=SG_D, handle=ticket)
    tr = TrtllmDisaggProtocol().prefill_body(Endpoint.CHAT, "served", fields, prefill=TR_P, decode=TR_D)
    for body in (sg, tr):
        json.dumps(body)
        assert "client" not in body and "extra_headers" not in body and body["model"] == "served"
        assert body["seed"] == 3 and body["top_k"] == 5  # the prefill samples the first token
