import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.request import DisaggRequest, endpoint_of, record_call_type, strip_transfer_params


def test_strip_removes_top_level_and_extra_body_params():
    data = {"model": "m", "kv_transfer_params": {"x": 1}, "extra_body": {"kv_transfer_params": {"y": 2}, "keep": 1}}
    assert strip_transfer_params(data) == ["kv_transfer_params", "extra_body.kv_transfer_params"]
    assert data == {"model": "m", "extra_body": {"keep": 1}}
    assert strip_transfer_params(data) == []


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, Endpoint.CHAT),
        ({"metadata": {"litellm_disagg_call_type": "atext_completion"}}, Endpoint.COMPLETIONS),
        ({"metadata": {"litellm_disagg_call_type": "acompletion"}}, Endpoint.CHAT),
        ({"proxy_server_request": {"url": "http://h/v1/completions"}}, Endpoint.COMPLETIONS),
        ({"proxy_server_request": {"url": "http://h/v1/chat/completions?x=1"}}, Endpoint.CHAT),
    ],
)
def test_endpoint_detection(kwargs, expected):
    assert endpoint_of(kwargs) is expected


def test_record_call_type_uses_existing_metadata():
    data = {"litellm_metadata": {"a": 1}}
    record_call_type(data, "text_completion")
    assert data == {"litellm_metadata": {"a": 1, "litellm_disagg_call_type": "text_completion"}}


def test_text_prompt_comes_from_the_router_message():
    kwargs = {"metadata": {"litellm_disagg_call_type": "text_completion"}, "max_tokens": 3, "litellm_call_id": "x"}
    req = DisaggRequest.from_router_call(messages=[{"role": "user", "content": "hello"}], request_kwargs=kwargs)
    assert req.endpoint is Endpoint.COMPLETIONS and req.fields["prompt"] == "hello"
    assert "litellm_call_id" not in req.fields and "metadata" not in req.fields
    assert req.splittable


@pytest.mark.parametrize(
    ("prompt", "n", "splittable"),
    [("a", None, True), ([1, 2, 3], None, True), (["a", "b"], None, False), ("a", 2, False), ([], None, False)],
)
def test_only_single_prompt_single_completion_requests_split(prompt, n, splittable):
    kwargs = {"metadata": {"litellm_disagg_call_type": "text_completion"}, "prompt": prompt}
    if n:
        kwargs["n"] = n
    assert DisaggRequest.from_router_call(messages=None, request_kwargs=kwargs).splittable is splittable


def test_transfer_metadata_is_stripped_wherever_an_engine_would_read_it():
    data = {
        "kv_transfer_params": {"remote_block_ids": [1]},
        "vllm_xargs": {"kv_transfer_params": "x", "keep": 1},
        "extra_body": {"kv_transfer_params": {}, "vllm_xargs": {"kv_transfer_params": [1, 2]}, "other": True},
    }
    found = strip_transfer_params(data)
    assert sorted(found) == sorted([
        "kv_transfer_params", "vllm_xargs.kv_transfer_params", "extra_body.kv_transfer_params",
        "extra_body.vllm_xargs.kv_transfer_params",
    ])
    assert data == {"vllm_xargs": {"keep": 1}, "extra_body": {"vllm_xargs": {}, "other": True}}
    assert strip_transfer_params({"vllm_xargs": "not a dict", "kv_transfer_params": None}) == []
