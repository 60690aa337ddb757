"""In the proxy the plugin arms Python's faulthandler, so a crash in a C extension leaves every thread's stack in
the proxy's log (two proxies died of a segfault on 2026-12-02 with nothing in their logs)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_proxy_branch_arms_the_faulthandler() -> None:
    code = (
        "import faulthandler, sys; assert not faulthandler.is_enabled()\n"
        "from litellm_disagg.plugin import arm_faulthandler\n"
        "arm_faulthandler(); assert faulthandler.is_enabled()\n"
        "import ctypes; ctypes.string_at(0)\n"  # a segfault: the handler writes the stack, the process dies of it
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert 'File "<string>", line 4' in done.stderr
