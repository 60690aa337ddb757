"""``litellm-disagg top`` in a real terminal (tmux), against simulated workers registered in a file registry: what the
screen shows (worker ids, roles, states), and that it redraws with fresh values; ``--once``; the ``workers`` table
and its ``--json`` lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from litellm_disagg.processes import spawn, stop, wait_until

CLI = [sys.executable, "-m", "litellm_disagg.cli"]


def tmux_or_fail() -> str:
    tmux = shutil.which("tmux")
    if tmux is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is missing: scripts/setup.sh installs it (as root)")
        pytest.skip("tmux is missing: scripts/setup.sh installs it (as root)")
    return tmux


class Cluster:
    def __init__(self, registry_dir: Path, log: Path):
        self.registry_dir = registry_dir
        self.log = log
        self.proc = spawn(
            [sys.executable, "-m", "litellm_disagg.sim", "--prefill", "1", "--decode", "1", "--name", "topsim",
             "--registry-dir", str(registry_dir), "--speedup", "100", "--drain-settle", "0", "--log-level", "WARNING"],
            log=log,
        )
        wait_until(lambda: self.log.read_text().count("READY ") == 2, timeout_s=60, interval_s=0.2,
                   alive=lambda: self.proc.poll() is None, what="two simulated workers")
        ready = [line.split() for line in log.read_text().splitlines() if line.startswith("READY ")]
        self.urls = {fields[1]: fields[2] for fields in ready}

    def worker(self, role: str) -> tuple[str, str]:
        return next((wid, url) for wid, url in self.urls.items() if f"-{role}-" in wid)


@pytest.fixture
def cluster(tmp_path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "registry", tmp_path / "sim.log")
    try:
        yield c
    finally:
        stop(c.proc, timeout_s=30)


def settle(check, describe, timeout_s: float = 60.0) -> None:
    """``wait_until`` whose failure shows the last screen."""
    try:
        wait_until(check, timeout_s=timeout_s, interval_s=0.2)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {describe()}") from None


def row(screen: str, worker_id: str) -> list[str]:
    """The cells of ``worker_id``'s row: worker, model, role, state, run, wait, kv, prefix hit, done, done/s."""
    line = next((line for line in screen.splitlines() if line.strip().startswith(worker_id)), None)
    assert line is not None, screen
    return line.split()


def test_top_shows_the_cluster_live_in_a_terminal(cluster, tmp_path):
    tmux = tmux_or_fail()
    socket = f"ld-top-{os.getpid()}"
    run = lambda *a: subprocess.run([tmux, "-L", socket, *a], capture_output=True, text=True, check=True)  # noqa: E731
    command = " ".join(CLI + ["top", "--registry-dir", str(cluster.registry_dir), "--interval", "0.3"])
    # The pane's own size, not a COLUMNS/LINES the test runner may export (rich prefers those).
    run("new-session", "-d", "-s", "top", "-x", "150", "-y", "30",
        f"cd {os.getcwd()} && exec env -u COLUMNS -u LINES {command}")
    screen = ""

    def shows(*texts: str) -> bool:
        nonlocal screen
        screen = run("capture-pane", "-p", "-t", "top").stdout
        return all(t in screen for t in texts)

    try:
        prefill_id, _ = cluster.worker("prefill")
        decode_id, decode_url = cluster.worker("decode")
        # Both rows, read from the workers' pages (a frame where a busy machine made a page late says "unreachable").
        settle(lambda: shows(prefill_id, decode_id, "PREFIX HIT") and "unreachable" not in screen,
               lambda: f"top to show both workers; screen:\n{screen}")
        assert row(screen, prefill_id)[2:4] == ["prefill", "ready"]
        assert row(screen, decode_id)[2:4] == ["decode", "ready"]
        assert row(screen, decode_id)[8] == "0"  # DONE
        assert "sim-model: 1 decode 1 prefill" in screen
        assert "n/a (no --metrics-url)" in screen

        body = {"messages": [{"role": "user", "content": "a question for the decode worker"}], "max_tokens": 4}
        for _ in range(3):
            httpx.post(f"{decode_url}/chat/completions", json=body, timeout=30).raise_for_status()
        settle(lambda: shows(decode_id) and row(screen, decode_id)[8] == "3",
               lambda: f"top to redraw the decode worker's finished requests; screen:\n{screen}")
        # Redrawn in place: one header, one row per worker, however many frames went by.
        assert screen.count("litellm-disagg top") == 1 and screen.count(decode_id) == 1
    finally:
        subprocess.run([tmux, "-L", socket, "kill-server"], capture_output=True)


def test_top_once_and_the_workers_table(cluster):
    prefill_id, _ = cluster.worker("prefill")
    decode_id, _ = cluster.worker("decode")
    registry = ["--registry-dir", str(cluster.registry_dir)]
    once = subprocess.run(CLI + ["top", "--once", *registry], capture_output=True, text=True, check=True, timeout=60)
    assert row(once.stdout, prefill_id)[2:4] == ["prefill", "ready"] and "no --metrics-url" in once.stdout

    table = subprocess.run(CLI + ["workers", *registry], capture_output=True, text=True, check=True, timeout=60)
    assert table.stdout.split()[:4] == ["WORKER", "MODEL", "ROLE", "STATE"]
    assert row(table.stdout, decode_id)[:5] == [decode_id, "sim-model", "decode", "ready", "vllm"]

    lines = subprocess.run(CLI + ["workers", "--json", *registry], capture_output=True, text=True, check=True,
                           timeout=60).stdout.splitlines()
    by_id = {c["worker_id"]: c for c in map(json.loads, lines)}
    assert set(by_id) == {prefill_id, decode_id} and by_id[decode_id]["role"] == "decode"
    assert by_id[decode_id]["base_url"].endswith("/v1") and "transfer" in by_id[decode_id]


def test_top_without_workers_or_discovery_says_so(tmp_path):
    once = subprocess.run(CLI + ["top", "--once", "--registry-dir", str(tmp_path / "empty")], capture_output=True,
                          text=True, check=True, timeout=60)
    assert "no workers in discovery" in once.stdout
