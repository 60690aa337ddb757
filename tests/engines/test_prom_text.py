"""engines.prom_text: typed samples from a Prometheus text page, all of them or only the wanted names."""

from __future__ import annotations

import pytest

from litellm_disagg.engines.prom_text import Sample, Wanted, samples, sums

PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_running_total{model_name="m"} 99.0
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000",model_name="m"} 1.0
process_start_time_seconds 1.7e+09
"""


def test_every_sample_in_page_order():
    got = list(samples(PAGE))
    assert [s.name for s in got] == [
        "vllm:num_requests_running",
        "vllm:num_requests_running",
        "vllm:num_requests_running_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:cache_config_info",
        "process_start_time_seconds",
    ]
    assert got[0] == Sample("vllm:num_requests_running", {"engine": "0", "model_name": "m"}, 3.0)
    assert got[-1].labels == {} and got[-1].value == 1.7e9


def test_wanted_names_only_and_no_prefix_matches():
    wanted = Wanted(["vllm:num_requests_running", "vllm:cache_config_info", "absent"])
    got = list(samples(PAGE, wanted))
    assert sorted((s.name, s.value) for s in got) == [
        ("vllm:cache_config_info", 1.0),
        ("vllm:num_requests_running", 1.0),
        ("vllm:num_requests_running", 3.0),
    ]
    assert sums(PAGE, wanted) == {"vllm:num_requests_running": 4.0, "vllm:cache_config_info": 1.0}
    assert list(samples("process_start_time_seconds 5", Wanted(["process_start_time_seconds"]))) == [
        Sample("process_start_time_seconds", {}, 5.0)
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('m{a="}"} 1.5 1700000000', Sample("m", {"a": "}"}, 1.5)),  # a brace in a value; a timestamp
        ('m{a="}",b="x"} 2', Sample("m", {"a": "}", "b": "x"}, 2.0)),
        ('m{a="1",b="}"} 2', Sample("m", {"a": "1", "b": "}"}, 2.0)),
        ('m{a="q\\"x\\\\y\\nz",b="2",} 3', Sample("m", {"a": 'q"x\\y\nz', "b": "2"}, 3.0)),  # escapes, trailing comma
        ("m{} 4", Sample("m", {}, 4.0)),
        ('m{a = "1" , b="2"} 5', Sample("m", {"a": "1", "b": "2"}, 5.0)),
        ("m\t+Inf", Sample("m", {}, float("inf"))),
        ("m -Inf", Sample("m", {}, float("-inf"))),
        ("m 6\r", Sample("m", {}, 6.0)),
    ],
)
def test_one_line(line, expected):
    assert list(samples(line)) == [expected]
    assert list(samples("x 0\n" + line + "\n", Wanted(["m"]))) == [expected]


@pytest.mark.parametrize(
    "line",
    ['m{a="x} 3', "m NaNish", "m", 'm{a="1" 2', "m{a=1} 2", '{a="1"} 2', "# m 1", ""],
)
def test_lines_that_do_not_parse_are_skipped(line):
    assert list(samples(f"{line}\nm 7\n")) == [Sample("m", {}, 7.0)]
    assert list(samples(f"{line}\nm 7\n", Wanted(["m"]))) == [Sample("m", {}, 7.0)]


def test_nan_is_a_value():
    (sample,) = samples("m NaN")
    assert sample.value != sample.value


def test_where_keeps_one_label_value_and_labelled_skips_reading_labels():
    page = (
        'tokens{engine="0",source="local_compute"} 1\n'
        'tokens{source="external_kv_transfer",engine="0"} 2\n'
        'tokens{engine="1",source="external_kv_transfer"} 4\n'
        'tokens{engine="1",xsource="external_kv_transfer"} 8\n'  # another label whose name ends the same way
        'tokens{engine="1",source="external_kv_transfer_2"} 16\n'
        'tokens{engine="2\\"",source="external_kv_transfer"} 32\n'  # escapes: read the careful way
        "tokens 64\n"  # no labels at all
        'other{source="x"} 128\n'
    )
    wanted = Wanted(["tokens", "other"], labelled=["other"], where={"tokens": ("source", "external_kv_transfer")})
    got = sorted(samples(page, wanted), key=lambda s: s.value)
    assert [(s.name, s.value) for s in got] == [("tokens", 2.0), ("tokens", 4.0), ("tokens", 32.0), ("other", 128.0)]
    assert [dict(s.labels) for s in got] == [{}, {}, {}, {"source": "x"}]
    assert sums(page, wanted) == {"tokens": 38.0, "other": 128.0}
