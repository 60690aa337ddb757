"""Sample a running proxy with py-spy (``--profile-proxy``): one raw stack file per proxy and arm, for
``py-spy``'s flame graphs or ``summarize`` below. py-spy is not a dependency: ``pip install py-spy``."""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Sampler:
    proc: subprocess.Popen[bytes]
    out: Path


def start(pid: int, out: Path, *, rate: int = 200) -> Sampler:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    # --gil: only the thread holding the GIL is sampled, so the samples add up to the process's Python CPU time;
    # --nonblocking: the proxy is not paused for each sample (it would slow down the run being measured).
    argv = [exe, "record", "-p", str(pid), "--gil", "--threads", "--nonblocking", "-r", str(rate)]
    argv += ["--format", "raw", "-o", str(out)]
    return Sampler(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)


def stop(sampler: Sampler) -> Path:
    sampler.proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
    try:
        sampler.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        sampler.proc.kill()
        sampler.proc.wait()
    return sampler.out


def summarize(path: Path, *, top: int = 25, leaf_frames: int = 1) -> list[tuple[int, str]]:
    """The most sampled ``leaf_frames``-deep stack tails of a raw py-spy file (``stack;frames count`` lines)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[";".join(stack.split(";")[-leaf_frames:])] += int(n)
    return [(n, s) for s, n in counts.most_common(top)]


if __name__ == "__main__":
    for n, s in summarize(Path(sys.argv[1]), leaf_frames=int(sys.argv[2]) if len(sys.argv) > 2 else 1):
        print(f"{n:7d}  {s}")
