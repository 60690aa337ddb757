"""``python -m litellm_disagg.sim``: run a simulated cluster, registered in a file registry, until SIGTERM/SIGINT.

    python -m litellm_disagg.sim --prefill 2 --decode 2 --model sim-model --registry-dir DIR [--speedup 50]
                                 [--engine vllm|sglang|trtllm]

Prints one ``READY <worker_id> <base_url>`` line per worker. On SIGTERM or SIGINT every worker drains (DRAINING,
waits for its in-flight work, withdraws) and the command exits 0; a second signal stops at once. Every other setting
can also come from ``LITELLM_DISAGG_SIM_*`` environment variables (see ``settings.py``); flags win.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.discovery.file.settings import FileRegistrySettings, default_registry_dir
from litellm_disagg.sim.cluster import SimCluster
from litellm_disagg.sim.settings import EngineSettings, SimSettings, TimingSettings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m litellm_disagg.sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--prefill", type=int, default=1, help="prefill workers (default 1)")
    p.add_argument("--decode", type=int, default=1, help="decode workers (default 1)")
    p.add_argument("--both", type=int, default=0, help="workers that do both (default 0)")
    p.add_argument("--model", help="served model name (default: sim-model)")
    p.add_argument(
        "--engine",
        choices=("vllm", "sglang", "trtllm"),
        help="which engine's transfer protocol, transfer section and metric names the workers use (default vllm)",
    )
    p.add_argument("--name", default=f"sim{os.getpid()}", help="worker id prefix (default: sim<pid>)")
    p.add_argument(
        "--registry-dir",
        default=None,
        help="file registry directory (default: $LITELLM_DISAGG_REGISTRY_DIR or ~/.cache/litellm-disagg/registry)",
    )
    p.add_argument("--ttl", type=float, default=FileRegistrySettings().ttl_s, help="registry entry TTL, seconds")
    p.add_argument("--heartbeat-interval", type=float, default=FileRegistrySettings().heartbeat_interval_s)
    p.add_argument("--speedup", type=float, help="run simulated time this many times faster than real time")
    p.add_argument("--block-size", type=int)
    p.add_argument("--num-gpu-blocks", type=int, help="KV cache capacity per worker, in blocks")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--kv-events", action="store_true", help="publish KV events (ZMQ, a free port on 127.0.0.1)")
    p.add_argument("--request-log", help="append one JSON line of timing per finished request to this file")
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument(
        "--drain-settle",
        type=float,
        default=1.0,
        help="seconds a draining worker must stay idle before it leaves (covers routers' poll interval)",
    )
    p.add_argument("--log-level", default="INFO")
    return p


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    base = SimSettings()
    top: dict[str, Any] = base.model_dump()
    engine = {
        "block_size": args.block_size,
        "num_gpu_blocks": args.num_gpu_blocks,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
    }
    top["engine"] = EngineSettings.model_validate(
        {**top["engine"], **{k: v for k, v in engine.items() if v is not None}}
    )
    if args.speedup is not None:
        top["timing"] = TimingSettings.model_validate({**top["timing"], "speedup": args.speedup})
    if args.model:
        top["model"] = args.model
    if args.engine:
        top["engine_name"] = args.engine
    if args.kv_events:
        top["kv_events"] = True
    if args.request_log:
        top["request_log"] = args.request_log
    return SimSettings.model_validate(top)


async def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    registry = FileRegistry(args.registry_dir or default_registry_dir(), ttl_s=args.ttl)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            os._exit(1)  # second signal: leave now
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    cluster = SimCluster(
        registry=registry, settings=settings, name=args.name, heartbeat_interval_s=args.heartbeat_interval
    )
    try:
        workers = await cluster.start(prefill=args.prefill, decode=args.decode, both=args.both)
        for w in workers:
            print(
                f"READY {w.worker_id} {w.base_url}"
                + (f" kv-events {w.kv_events_endpoint}" if w.kv_events_endpoint else ""),
                flush=True,
            )
        await stop.wait()
        logging.getLogger(__name__).info("draining %d workers", len(cluster.workers))
        await cluster.drain_all(timeout_s=args.drain_timeout, settle_s=args.drain_settle)
    finally:
        await cluster.close()
        await registry.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if min(args.prefill, args.decode, args.both) < 0 or args.prefill + args.decode + args.both == 0:
        print("need at least one worker", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(args))
