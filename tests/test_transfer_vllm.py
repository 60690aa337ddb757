from litellm_disagg.transfer.vllm import Endpoint, KVTransferParams, build_prefill_body


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
