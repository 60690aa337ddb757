"""The serving benchmarks' shared command-line helpers: the workload shape read from each command's arguments, and
the run directory. No servers."""

from __future__ import annotations

from bench.serving import __main__ as serving
from bench.serving import cli, pd, replicas, workloads

SIZES = ["--requests", "7", "--rate", "3.5", "--turns", "2", "--think", "0.25", "--prefix-words", "90",
         "--question-words", "11", "--documents", "5"]


def test_each_command_reads_the_same_shape_from_its_arguments():
    expected = workloads.Shape(requests=7, rate=3.5, turns=2, think_s=0.25, prefix_words=90, question_words=11,
                               documents=5)
    assert cli.shape_from_args(pd.parse_args(SIZES)) == expected  # pd has no --zipf: the shape's default skew
    assert cli.shape_from_args(replicas.parse_args([*SIZES, "--zipf", "2.0"])) == workloads.Shape(
        **{**vars(expected), "zipf_s": 2.0})


def test_the_serving_command_passes_its_zipf_default_through(monkeypatch):
    monkeypatch.setattr("sys.argv", ["python -m bench.serving", *SIZES])
    assert cli.shape_from_args(serving.parse_args()).zipf_s == workloads.Shape.zipf_s


def test_a_run_directory_is_new_each_time_and_printed(capsys):
    first, second = cli.new_run_dir("serving-test-"), cli.new_run_dir("serving-test-")
    try:
        assert first != second and first.is_dir() and second.is_dir()
        assert first.name.startswith("serving-test-")
        core = cli.kv_core_line()
        assert capsys.readouterr().out.splitlines() == [f"logs and configs: {first}", core,
                                                        f"logs and configs: {second}", core]
    finally:
        first.rmdir()
        second.rmdir()


def test_the_run_says_when_the_kv_core_is_not_compiled(monkeypatch):
    """A clone without ``scripts/build_native.sh`` run in it benchmarks the pure-Python fallback: the run says so."""
    from litellm_disagg.routing.kv import native

    monkeypatch.setattr(native, "NATIVE", True)
    monkeypatch.setattr(native, "wire", object())
    assert cli.kv_core_line() == "KV routing core: compiled"
    monkeypatch.setattr(native, "NATIVE", False)
    monkeypatch.setattr(native, "WHY", "not built (No module named '_kvcore')")
    assert cli.kv_core_line().startswith("KV routing core: PURE PYTHON (not built")
