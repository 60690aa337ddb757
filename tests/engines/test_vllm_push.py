"""vLLM's push connector on the seam: the transfer section a push worker publishes, its launch, the concurrent
protocol's fields (what each half carries), and that routers pair only workers of the same transfer kind."""

import json

import pytest
from pydantic import ValidationError

from litellm_disagg.engines import client_transfer_keys, get_engine, transfer_for
from litellm_disagg.engines.base import Endpoint, InvalidTransfer, LaunchSpec
from litellm_disagg.engines.vllm.launch import vllm_launch
from litellm_disagg.engines.vllm.push import PushTicket, VllmNixlPushProtocol
from litellm_disagg.engines.vllm.transfer import VllmNixlProtocol
from litellm_disagg.routing.pipeline import filters
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlPushTransfer, VllmNixlTransfer, WorkerRole

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "temperature": 0.5, "stream": True,
        "stream_options": {"include_usage": True}}


def config(worker_id: str, transfer, role: str = "prefill", tp: int = 1) -> RuntimeConfig:
    return RuntimeConfig(worker_id=worker_id, model="m", role=role, engine="vllm", base_url=f"http://{worker_id}:8000/v1",
                         transfer=transfer, kv_capacity_blocks=100, block_size=16, tensor_parallel_size=tp)


PUSH_P = config("p", VllmNixlPushTransfer(host="10.0.0.7", port=5600, engine_id="prefill-5600-abc"), tp=2)
PUSH_D = config("d", VllmNixlPushTransfer(host="10.0.0.8", port=5601, engine_id="decode-5601-def"), "decode")
PULL_P = config("pp", VllmNixlTransfer(host="10.0.0.9", port=5602))
PULL_D = config("pd", VllmNixlTransfer(host="10.0.0.10", port=5603), "decode")


def answer(engine_id: str = "prefill-5600-abc", host: str = "10.0.0.7", port: int = 5600) -> dict:
    """What a push-mode vLLM prefill answers (push_scheduler.request_finished)."""
    return {"choices": [{"index": 0, "text": "x"}], "usage": {"prompt_tokens": 20},
            "kv_transfer_params": {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2]],
                                   "remote_engine_id": engine_id, "remote_request_id": "chatcmpl-r1-0123abcd",
                                   "remote_host": host, "remote_port": port, "tp_size": 2, "dcp_size": 1, "pp_size": 1,
                                   "remote_num_tokens": 20, "transfer_mode": "push"}}


def test_a_push_worker_resolves_to_the_concurrent_push_protocol_and_a_pull_worker_to_pull():
    assert isinstance(transfer_for(PUSH_P), VllmNixlPushProtocol) and transfer_for(PUSH_P).concurrent
    assert isinstance(transfer_for(PULL_P), VllmNixlProtocol) and not transfer_for(PULL_P).concurrent
    assert get_engine("vllm").transfer is transfer_for(PULL_P)  # pull stays the engine's default
    assert "kv_transfer_params" in client_transfer_keys()


def test_the_decode_names_the_prefill_engine_before_the_prefill_runs():
    protocol = VllmNixlPushProtocol()
    ticket = protocol.open_transfer(prefill=PUSH_P, decode=PUSH_D, request_id="r1")
    assert ticket == PushTicket(request_id="r1", prefill_engine_id="prefill-5600-abc", prefill_host="10.0.0.7",
                                prefill_port=5600, prefill_tp_size=2)
    # What push_scheduler.update_state_after_alloc reads on the decode side: the prefill's coordinates.
    assert protocol.decode_fields(ticket) == {"kv_transfer_params": {
        "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "prefill-5600-abc",
        "remote_host": "10.0.0.7", "remote_port": 5600, "tp_size": 2, "remote_request_id": "r1",
        "transfer_mode": "push"}}
    # The prefill request is the pull connector's: one token, no stream, do_remote_decode.
    body = protocol.prefill_body(Endpoint.CHAT, "served", CHAT, prefill=PUSH_P, decode=PUSH_D, handle=ticket)
    assert body["max_tokens"] == 1 and body["stream"] is False and body["model"] == "served"
    assert body["kv_transfer_params"] == {"do_remote_decode": True} and "stream_options" not in body
    # A failed prefill ends the decode through vLLM's abort endpoint, by the ids its OpenAI server gives the decode.
    assert protocol.abort_decode(ticket) == ("abort_requests", {"request_ids": ["chatcmpl-r1", "cmpl-r1-0"]})


def test_the_prefill_answer_is_checked_against_the_published_engine_and_the_handle_stays_the_ticket():
    protocol = VllmNixlPushProtocol()
    ticket = protocol.open_transfer(prefill=PUSH_P, decode=PUSH_D, request_id="r1")
    assert protocol.parse_prefill(answer(), prefill=PUSH_P, handle=ticket) is ticket
    # vLLM 0.32 adds remote_prefill_cached_tokens when the prefill had prefix-cache hits (seen on real workers).
    cached = answer()
    cached["kv_transfer_params"]["remote_prefill_cached_tokens"] = 16
    assert protocol.parse_prefill(cached, prefill=PUSH_P, handle=ticket) is ticket
    assert VllmNixlProtocol().parse_prefill(cached, prefill=PUSH_P).remote_prefill_cached_tokens == 16
    for bad in (answer(engine_id="prefill-5600-other"), answer(host="10.6.6.6"), {"choices": []},
                {"kv_transfer_params": {"do_remote_prefill": False}}):
        with pytest.raises(InvalidTransfer):
            protocol.parse_prefill(bad, prefill=PUSH_P, handle=ticket)
    with pytest.raises(InvalidTransfer):
        protocol.parse_prefill(answer(), prefill=PUSH_P, handle=None)
    with pytest.raises(InvalidTransfer):  # a pull worker has no engine id to name up front
        protocol.open_transfer(prefill=PULL_P, decode=PUSH_D, request_id="r1")


def test_the_push_section_is_strict_needs_an_engine_id_and_fits_only_vllm():
    with pytest.raises(ValidationError):
        VllmNixlPushTransfer(host="h", port=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        VllmNixlPushTransfer(host="h", port=1, engine_id="bad id with spaces")
    with pytest.raises(ValidationError):
        RuntimeConfig(worker_id="x", model="m", role="prefill", engine="sglang", base_url="http://x/v1",
                      transfer=PUSH_P.transfer, kv_capacity_blocks=0, block_size=1)
    data = json.loads(PUSH_P.model_dump_json())
    assert "nixl_host" not in data  # a 0.1 router, which knows only pull, does not take a push worker for one
    assert RuntimeConfig.model_validate(data) == PUSH_P


def test_launch_push_runs_the_push_connector_under_the_engine_id_it_publishes():
    spec = LaunchSpec(model="/m", served_model_name="m", role=WorkerRole.PREFILL, host="127.0.0.1", port=8100,
                      transfer_host="127.0.0.1", transfer_port=5600, device="cpu", kv_transfer="push")
    first, second = vllm_launch(spec, base_env={}), vllm_launch(spec, base_env={})
    kv_config = json.loads(first.argv[first.argv.index("--kv-transfer-config") + 1])
    assert kv_config["kv_connector"] == "NixlPushConnector" and kv_config["kv_role"] == "kv_producer"
    assert isinstance(first.transfer, VllmNixlPushTransfer)
    assert kv_config["engine_id"] == first.transfer.engine_id
    assert first.transfer.engine_id != second.transfer.engine_id  # a restarted engine gets a new id
    assert (first.transfer.host, first.transfer.port) == ("127.0.0.1", 5600)
    pull = vllm_launch(LaunchSpec(**{**spec.__dict__, "kv_transfer": "pull"}), base_env={})
    assert json.loads(pull.argv[pull.argv.index("--kv-transfer-config") + 1])["kv_connector"] == "NixlConnector"
    assert isinstance(pull.transfer, VllmNixlTransfer)


def test_routers_pair_only_workers_of_the_same_transfer_kind():
    prefills = [PUSH_P, PULL_P]
    assert filters.same_transfer(PUSH_D)(prefills) == [PUSH_P]
    assert filters.same_transfer(PULL_D)(prefills) == [PULL_P]


def test_worker_cli_refuses_push_for_an_engine_without_it(capsys):
    from litellm_disagg.cli import main

    code = main(["worker", "--role", "prefill", "--model", "/m", "--engine", "sglang", "--kv-transfer", "push"])
    assert code == 2 and "only vLLM" in capsys.readouterr().err
