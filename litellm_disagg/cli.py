"""The ``litellm-disagg`` command.

    litellm-disagg worker --role prefill|decode|both --model PATH_OR_NAME [--engine vllm] [--port N] [-- engine args]
    litellm-disagg up [--model PATH] [--port 4000]        one prefill + one decode worker + the LiteLLM proxy
    litellm-disagg prepare-model [--tiny] [--out DIR]     make a model offline (SmolLM2-135M-Instruct or a tiny one)
    litellm-disagg workers [--registry-dir DIR] [--json]  list the workers discovery knows (a table; JSON lines)
    litellm-disagg role WORKER prefill|decode|both        move a --switchable worker to another pool, wait for it
    litellm-disagg top [--metrics-url URL] [--once]       a live view of the cluster (observability/top.py)
    litellm-disagg profile --url URL --max-num-batched-tokens N   measure an engine profile (planner/profiler.py)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from litellm_disagg.discovery.cli import add_registry_args, registry_from_args
from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.engines import ENGINES, get_engine
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.version import __version__

if TYPE_CHECKING:
    from litellm_disagg.engines.base import LaunchSpec
    from litellm_disagg.workers.bind_failure import BindFailure

MIB = 1024 * 1024


def _worker_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("worker", help="run one vLLM worker (prefill, decode or both) and register it")
    p.add_argument("--role", required=True, choices=[r.value for r in WorkerRole])
    p.add_argument("--model", required=True, help="model directory or name vLLM can load offline")
    p.add_argument("--served-model-name", help="name clients use (default: the model directory's name)")
    p.add_argument("--host", default="127.0.0.1", help="address vLLM listens on and publishes (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="vLLM HTTP port (default: a free one)")
    p.add_argument("--engine", choices=sorted(ENGINES), default="vllm", help="inference engine (default vllm)")
    p.add_argument("--nixl-host", help="KV transfer side-channel host, vLLM: NIXL's (default: --host)")
    p.add_argument("--nixl-port", type=int, help="KV transfer side-channel port, unique per host (default: free)")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--kv-cache-mib", type=int, help="KV cache size in MiB (default on CPU: 512)")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--kv-events-port", type=int, help="publish vLLM KV events on this port (ZMQ)")
    p.add_argument("--kv-load-failure-policy", choices=["recompute", "fail"], default="recompute")
    p.add_argument("--kv-lease-s", type=_lease_seconds, metavar="S",
                   help="vLLM: seconds a prefill keeps unread KV for its decode (kv_lease_duration; vLLM's default: 30)")
    p.add_argument("--api-key-file", help="file holding the key the proxy must present (vLLM's --api-key, passed by "
                   "environment; default: $LITELLM_DISAGG_WORKER_API_KEY; neither: the worker is open)")
    p.add_argument("--kv-transfer", choices=["pull", "push"], default="pull",
                   help="vLLM: NixlConnector (pull, default) or NixlPushConnector (push); routers pair like with like")
    p.add_argument("--switchable", action="store_true",
                   help="launch the engine to serve every role (vLLM: kv_role kv_both) and start in --role; the worker "
                        "then changes pool without a restart when asked (litellm-disagg role, the planner). vLLM pull "
                        "transfer only (docs/role-change.md)")
    p.add_argument("--worker-id", help="id in discovery (default: ROLE-HOST-PORT)")
    add_registry_args(p)
    p.add_argument("--heartbeat-interval", type=float, default=FileRegistrySettings().heartbeat_interval_s)
    p.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to wait for in-flight requests on shutdown")
    p.add_argument("--drain-settle", type=float, default=3.0, help="seconds the engine must stay idle before leaving")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="after --: extra arguments for the engine")


def _lease_seconds(text: str) -> int:
    """vLLM renews a lease with heartbeats every lease/6 s (integer seconds): at least 6."""
    try:
        seconds = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if seconds < 6:
        raise argparse.ArgumentTypeError(f"at least 6 s (vLLM heartbeats every lease/6 s), not {seconds}")
    return seconds


def _worker_api_key(path: str | None) -> str | None:
    """The worker's API key: ``--api-key-file``, else ``$LITELLM_DISAGG_WORKER_API_KEY``, else None (open)."""
    from litellm_disagg.routing.worker_auth import DEFAULT_ENV, read_key_file

    return read_key_file(path) if path else (os.environ.get(DEFAULT_ENV) or None)


_BIND_RETRIES = 3
"""Starts of one worker command when the NIXL side-channel port it picked itself turns out taken."""


def _run_worker(args: argparse.Namespace) -> int:
    from litellm_disagg.engines.base import LaunchSpec
    from litellm_disagg.ports import free_port
    from litellm_disagg.workers.wrapper import LifecycleOptions, WorkerWrapper, default_worker_id

    engine = get_engine(args.engine)
    role = WorkerRole(args.role)
    if args.kv_transfer == "push" and args.engine != "vllm":
        print(f"--kv-transfer push: only vLLM has a push connector (not {args.engine})", file=sys.stderr)
        return 2
    if args.switchable and (args.engine != "vllm" or args.kv_transfer != "pull"):
        print("--switchable: only vLLM with pull transfer (NixlConnector) serves every role from one launch "
              f"(not {args.engine} with {args.kv_transfer} transfer; docs/role-change.md)", file=sys.stderr)
        return 2
    device = engine.adapter.detect_device() if args.device == "auto" else args.device
    port = args.port or free_port(args.host)
    transfer_host = args.nixl_host or args.host
    kv_mib = args.kv_cache_mib if args.kv_cache_mib is not None else (512 if device == "cpu" else None)
    extra = [a for a in args.vllm_args if a != "--"]
    transfer_port = args.nixl_port or free_port(transfer_host)
    spec = LaunchSpec(
        model=args.model,
        served_model_name=args.served_model_name or Path(args.model.rstrip("/")).name,
        role=WorkerRole.BOTH if args.switchable else role,
        host=args.host,
        port=port,
        transfer_host=transfer_host,
        transfer_port=transfer_port,
        device=device,
        max_model_len=args.max_model_len,
        kv_cache_bytes=kv_mib * MIB if kv_mib is not None else None,
        tensor_parallel_size=args.tensor_parallel_size,
        kv_events_port=args.kv_events_port,
        kv_load_failure_policy=args.kv_load_failure_policy,
        kv_lease_s=args.kv_lease_s,
        api_key=_worker_api_key(args.api_key_file),
        kv_transfer=args.kv_transfer,
        extra_args=tuple(extra),
    )
    lifecycle = LifecycleOptions(
        worker_id=args.worker_id or default_worker_id(role, port),
        heartbeat_interval_s=args.heartbeat_interval,
        drain_timeout_s=args.drain_timeout,
        drain_settle_s=args.drain_settle,
        role=role,
        allowed_roles=tuple(WorkerRole) if args.switchable else (),
    )

    def run_once(launch: LaunchSpec) -> tuple[int, BindFailure | None]:
        wrapper = WorkerWrapper(launch, lifecycle, registry_from_args(args), engine=engine)
        return asyncio.run(wrapper.run()), wrapper.bind_failure

    return run_retrying_taken_port(spec, run_once, repick=None if args.nixl_port else lambda: free_port(transfer_host))


def run_retrying_taken_port(
    spec: LaunchSpec,
    run_once: Callable[[LaunchSpec], tuple[int, BindFailure | None]],
    *,
    repick: Callable[[], int] | None,
    attempts: int = _BIND_RETRIES,
) -> int:
    """Run the worker; when the engine could not bind the NIXL side-channel port and this command picked that port
    itself (``repick``; never an operator's ``--nixl-port``), start it again on another, up to ``attempts`` starts."""
    code = 1
    for _ in range(attempts):
        code, failed = run_once(spec)
        if failed is None or repick is None or failed.port != spec.transfer_port:
            return code
        print(f"litellm-disagg worker: NIXL side-channel port {spec.transfer_port} was taken; starting again on "
              "another", file=sys.stderr)
        spec = dataclasses.replace(spec, transfer_port=repick())
    return code


def _run_prepare(args: argparse.Namespace) -> int:
    if args.tiny:
        from litellm_disagg.models.tiny import make_tiny_llama

        print(make_tiny_llama(args.out or Path.home() / ".cache" / "litellm-disagg" / "models" / "tiny-llama"))
    else:
        from litellm_disagg.models.smollm2 import prepare_smollm2

        print(prepare_smollm2(args.out))
    return 0


def _run_workers(args: argparse.Namespace) -> int:
    from litellm_disagg.observability.top import print_workers

    configs = asyncio.run(registry_from_args(args).snapshot())
    print_workers(configs, as_json=args.json)
    return 0


def _run_role(args: argparse.Namespace) -> int:
    from litellm_disagg.discovery.role_command import change_role

    async def run() -> int:
        registry = registry_from_args(args)
        try:
            return await change_role(registry, args.worker_id, WorkerRole(args.role), timeout_s=args.timeout,
                                     out=sys.stdout, err=sys.stderr)
        finally:
            await registry.close()

    return asyncio.run(run())


def _run_drain_hook(args: argparse.Namespace) -> int:
    from litellm_disagg.discovery.drain_command import drain_named_worker
    from litellm_disagg.discovery.roles import AfterDrain

    async def run() -> int:
        registry = registry_from_args(args)
        try:
            return await drain_named_worker(registry, os.environ, then=AfterDrain.PARK if args.park else AfterDrain.EXIT,
                                            out=sys.stdout, err=sys.stderr)
        finally:
            await registry.close()

    return asyncio.run(run())


def _run_drain(args: argparse.Namespace) -> int:
    from litellm_disagg.discovery.drain_command import drain_worker
    from litellm_disagg.discovery.roles import AfterDrain

    async def run() -> int:
        registry = registry_from_args(args)
        try:
            return await drain_worker(registry, args.worker_id, timeout_s=args.timeout,
                                      then=AfterDrain.PARK if args.park else AfterDrain.EXIT,
                                      out=sys.stdout, err=sys.stderr)
        finally:
            await registry.close()

    return asyncio.run(run())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="litellm-disagg", description="Disaggregated prefill/decode for the LiteLLM proxy")
    parser.add_argument("--version", action="version", version=__version__)
    parser.add_argument("--log-level", default=os.environ.get("LITELLM_DISAGG_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)
    _worker_parser(sub)

    up = sub.add_parser("up", help="start a local disaggregated stack: a prefill and a decode worker and the proxy")
    up.add_argument("--model", help="model directory (default: SmolLM2-135M-Instruct, prepared offline)")
    up.add_argument("--served-model-name")
    up.add_argument("--port", type=int, default=4000, help="LiteLLM proxy port (default 4000)")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--config", help="proxy config (default: ./proxy_config.yaml, else the one shipped with the project)")
    up.add_argument("--kv-cache-mib", type=int, default=512)
    up.add_argument("--max-model-len", type=int, default=2048)
    up.add_argument("--registry-dir", help="file registry directory (default: a fresh one for this stack)")

    prep = sub.add_parser("prepare-model", help="make a model offline and print its directory")
    prep.add_argument("--tiny", action="store_true", help="a tiny random-weight Llama (for tests)")
    prep.add_argument("--out", help="output directory (default: under ~/.cache/litellm-disagg/models)")

    lst = sub.add_parser("workers", help="list the workers discovery knows")
    lst.add_argument("--json", action="store_true", help="one JSON object per worker and line (as published)")
    add_registry_args(lst)

    rc = sub.add_parser("role", help="move a running --switchable worker to another pool (prefill, decode, both)")
    rc.add_argument("worker_id", metavar="WORKER", help="the worker's id in discovery (litellm-disagg workers)")
    rc.add_argument("role", choices=[r.value for r in WorkerRole])
    rc.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the worker to publish it (30)")
    add_registry_args(rc)

    dr = sub.add_parser("drain", help="drain a running worker and take it out of discovery (as SIGTERM does)")
    dr.add_argument("worker_id", metavar="WORKER", help="the worker's id in discovery (litellm-disagg workers)")
    dr.add_argument("--timeout", type=float, default=180.0,
                    help="seconds to wait for the worker to leave discovery (180; its own --drain-timeout is 120)")
    dr.add_argument("--park", action="store_true",
                    help="after the drain, stop the worker's engine and keep its process until SIGTERM instead of "
                         "exiting (Kubernetes: the Deployment does not start it again, its readiness fails, and a "
                         "scale-down by one removes it first)")
    add_registry_args(dr)

    dh = sub.add_parser("drain-hook", help="the planner's hook_command: request the drain of the worker it names "
                                           "($LITELLM_DISAGG_DRAIN_WORKER), without waiting")
    dh.add_argument("desired", nargs="*", metavar="MODEL PREFILL DECODE BOTH",
                    help="the desired sizes the planner appends (ignored: the worker to remove is in the environment)")
    dh.add_argument("--park", action="store_true", help="the worker parks after its drain (see drain --park)")
    add_registry_args(dh)

    from litellm_disagg.planner.cli import add_planner_parser, add_profile_parser

    add_planner_parser(sub)
    add_profile_parser(sub)

    top = sub.add_parser("top", help="a live view of the cluster: pools, workers' load, the proxy's latencies")
    top.add_argument("--metrics-url", help="the proxy's Prometheus page (e.g. http://127.0.0.1:4000/metrics)")
    top.add_argument("--metrics-key", default=os.environ.get("LITELLM_MASTER_KEY"),
                     help="key for the proxy's /metrics (default: $LITELLM_MASTER_KEY)")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between frames (default 2)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    add_registry_args(top)

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.command == "worker":
        return _run_worker(args)
    if args.command == "up":
        from litellm_disagg.stack import run_stack

        return run_stack(args)
    if args.command == "prepare-model":
        return _run_prepare(args)
    if args.command == "workers":
        return _run_workers(args)
    if args.command == "role":
        return _run_role(args)
    if args.command == "drain":
        return _run_drain(args)
    if args.command == "drain-hook":
        return _run_drain_hook(args)
    if args.command == "planner":
        from litellm_disagg.planner.cli import run_planner

        return run_planner(args)
    if args.command == "profile":
        from litellm_disagg.planner.cli import run_profile

        return run_profile(args)
    if args.command == "top":
        from litellm_disagg.observability.top import run_top

        return run_top(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
