"""Start and stop the real LiteLLM proxy (``python -m litellm.proxy.proxy_cli --config ...``) for one arm."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from litellm_disagg.processes import spawn, stop, wait_until
from litellm_disagg.stack import proxy_ready
from litellm_disagg.workers.wrapper import free_port


@dataclass
class Proxy:
    base_url: str
    key: str
    proc: subprocess.Popen[bytes]
    log: Path

    def close(self) -> None:
        stop(self.proc, timeout_s=20)


def start(config: dict[str, Any], run_dir: Path, name: str, *, model: str, timeout_s: float = 180) -> Proxy:
    path = run_dir / f"proxy-{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    key = f"sk-bench-{secrets.token_hex(8)}"
    env = dict(os.environ, LITELLM_MASTER_KEY=key, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
    log = run_dir / f"proxy-{name}.log"
    proc = spawn([sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(path), "--host", "127.0.0.1",
                  "--port", str(port)], env=env, log=log)
    proxy = Proxy(f"http://127.0.0.1:{port}", key, proc, log)
    try:
        wait_until(lambda: proxy_ready(proxy.base_url, key, model), timeout_s=timeout_s, interval_s=0.5,
                   alive=lambda: proc.poll() is None, what=f"the proxy for {name} (see {log})")
    except BaseException:
        proxy.close()
        raise
    return proxy
