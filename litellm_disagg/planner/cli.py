"""``litellm-disagg planner``: the planner on its own, outside any proxy.

It reads the planner's, the registry's and the admission settings from a proxy config (``--config``, the
``litellm_disagg:`` section, so it plans with the same SLOs and over the same admitted workers as the proxies) or
from flags, the workers from discovery and their
``/metrics`` pages, the latencies from the proxies' ``/metrics`` pages (``--proxy-metrics``, repeatable: several
proxies add up), and acts through ``Registry.request_role``. It takes the same lock as a planner inside a proxy, so
running both is safe (one acts). ``--metrics-port`` serves its metrics (``litellm_disagg_planner_desired_workers``
for an autoscaler); ``--dry-run`` decides and logs but never asks a worker to move.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Any

from litellm_disagg.discovery.cli import add_registry_args, registry_settings_from_args

logger = logging.getLogger("litellm_disagg.planner")


def add_planner_parser(sub: Any) -> None:
    p = sub.add_parser("planner", help="run the dynamic planner on its own (moves workers between pools)")
    p.add_argument("--config", help="a proxy config (proxy_config.yaml): its litellm_disagg.planner and registry "
                                    "sections (flags below override)")
    p.add_argument("--proxy-metrics", action="append", default=[], metavar="URL",
                   help="a proxy's Prometheus page (repeatable), for TTFT and ITL; e.g. http://127.0.0.1:4000/metrics/")
    p.add_argument("--metrics-key", default=os.environ.get("LITELLM_MASTER_KEY"),
                   help="key for the proxies' /metrics (default: $LITELLM_MASTER_KEY)")
    p.add_argument("--ttft-ms", type=float, help="TTFT SLO (default: the config's, else 2000)")
    p.add_argument("--itl-ms", type=float, help="inter-token latency SLO (default: the config's, else 100)")
    p.add_argument("--interval", type=float, help="seconds between steps (default: the config's, else 5)")
    p.add_argument("--hook", nargs="+", metavar="ARG", help="hook command (argv) run when the desired sizes change")
    p.add_argument("--metrics-port", type=int, help="serve the planner's Prometheus metrics on this port")
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--dry-run", action="store_true", help="decide and log, never request a role change")
    p.add_argument("--steps", type=int, help="stop after this many acting steps (default: run until stopped)")
    add_registry_args(p)


def _settings(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from litellm_disagg.planner.settings import PlannerSettings
    from litellm_disagg.routing.admission import Admission
    from litellm_disagg.settings import DisaggSettings

    if args.config:
        import yaml

        disagg = DisaggSettings.from_proxy_config(yaml.safe_load(Path(args.config).read_text()) or {})
        if args.registry != "file" or args.registry_dir:
            disagg = disagg.model_copy(update={"registry": registry_settings_from_args(args)})
    else:
        disagg = DisaggSettings(registry=registry_settings_from_args(args))
    planner, registry = disagg.planner, disagg.registry
    admission = Admission(disagg.admission, model_groups=disagg.model_groups)
    overrides = {k: v for k, v in (("ttft_ms", args.ttft_ms), ("itl_ms", args.itl_ms), ("interval_s", args.interval),
                                   ("hook_command", args.hook)) if v is not None}
    planner = PlannerSettings.model_validate(planner.model_dump() | overrides)
    return planner, registry, admission


def run_planner(args: argparse.Namespace) -> int:
    try:
        planner_settings, registry_settings, admission = _settings(args)
    except (OSError, ValueError) as exc:
        logger.error("planner: bad settings: %s", exc)
        return 2
    return asyncio.run(_run(args, planner_settings, registry_settings, admission))


class _Admitted:
    """Discovery as the proxies see it: only the entries their admission rules let in (allowed models, networks;
    ``routing/admission.py``), so the planner scrapes and moves no worker a proxy would not route to."""

    def __init__(self, registry: Any, admission: Any):
        self._registry = registry
        self._admission = admission

    async def snapshot(self) -> list[Any]:
        return list(self._admission.admit(await self._registry.snapshot()))

    async def request_role(self, worker_id: str, role: Any) -> None:
        await self._registry.request_role(worker_id, role)


async def _run(args: argparse.Namespace, settings: Any, registry_settings: Any, admission: Any) -> int:
    from litellm_disagg.discovery.factory import make_registry
    from litellm_disagg.observability import metrics as m
    from litellm_disagg.planner.collect import ProxyPagesLatency, SignalCollector
    from litellm_disagg.planner.lock import make_lock
    from litellm_disagg.planner.loop import PlannerLoop

    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_host)
    if not args.proxy_metrics:
        logger.warning("planner: no --proxy-metrics: TTFT and ITL unknown, deciding on the workers' load alone")
    headers = {"Authorization": f"Bearer {args.metrics_key}"} if args.metrics_key else {}
    registry = make_registry(registry_settings)
    collector = SignalCollector(settings, ProxyPagesLatency(args.proxy_metrics, headers=headers))
    loop = PlannerLoop(settings, _Admitted(registry, admission), collector,
                       make_lock(registry_settings, settings.lock), dry_run=args.dry_run)
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        running.add_signal_handler(sig, stop.set)
    logger.info("planner: ttft %.0f ms, itl %.0f ms, every %.1f s, registry %s%s", settings.ttft_ms, settings.itl_ms,
                settings.interval_s, registry_settings.backend, " (dry run)" if args.dry_run else "")
    m.PLANNER_ENABLED.set(1)
    try:
        while not stop.is_set():
            try:
                await loop.tick()
            except Exception:
                logger.exception("planner step failed; trying again next interval")
            if args.steps is not None and loop.steps >= args.steps:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settings.interval_s):
                    await stop.wait()
    finally:
        m.PLANNER_ENABLED.set(0)
        await loop.stop()
        await registry.close()
    return 0


def add_profile_parser(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure a worker's engine profile (planner.engine_profile) through its API")
    p.add_argument("--url", required=True, help="the worker's OpenAI API, e.g. http://127.0.0.1:8100 (with or "
                                                "without /v1); it must be otherwise idle")
    p.add_argument("--max-num-batched-tokens", type=int,
                   help="the step budget the both workers run with (vLLM's --max-num-batched-tokens); required "
                        "unless --profile gives the profile")
    p.add_argument("--model", help="the served model to profile (default: the worker's first)")
    p.add_argument("--api-key", default=os.environ.get("LITELLM_DISAGG_WORKER_API_KEY"),
                   help="the worker's API key, if it has one (default: $LITELLM_DISAGG_WORKER_API_KEY)")
    p.add_argument("--batches", help="decode batch sizes, comma-separated (default 1,2,4,8,16)")
    p.add_argument("--output-tokens", type=int, help="tokens per decode request (default 48)")
    p.add_argument("--prompt-tokens", help="prompt lengths for the prefill rate, comma-separated (default: a "
                                           "quarter and three quarters of the model's context, at most 8192)")
    p.add_argument("--repeats", type=int, help="measurements per point; the median is kept (default 3)")
    p.add_argument("--runs", type=int, default=1,
                   help="whole profiling runs, each fitted; the profile printed is each number's median over them "
                        "(default 1; on noisy hardware 3 or more)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    p.add_argument("--json", action="store_true", help="print the profile and the points as JSON")
    p.add_argument("--check-load", help="then serve a mixed load at each of these request rates (comma-separated, "
                                        "requests/s) and compare the ITL with the profile's estimate "
                                        "(planner/mixing_check.py)")
    p.add_argument("--check-prompt-tokens", type=int, default=512, help="prompt tokens per check request (512)")
    p.add_argument("--check-output-tokens", type=int, default=64, help="output tokens per check request (64)")
    p.add_argument("--check-seconds", type=float,
                   help="seconds of arrivals per check load (default: long enough for 200 requests, 200 / rate: "
                        "with fewer the percentile swings with the arrival sample)")
    p.add_argument("--profile", dest="profile_file",
                   help="check this profile instead of measuring one: a YAML file with the engine_profile block "
                        "(as printed here) or a proxy_config.yaml with litellm_disagg.planner.engine_profile; "
                        "needs --check-load")
    p.add_argument("--headroom", type=float, default=0.7,
                   help="the planner's headroom: the share of the ITL SLO it holds the estimate under (0.7)")
    p.add_argument("--quantile", type=float, default=0.9, help="the ITL percentile compared (0.9)")


def run_profile(args: argparse.Namespace) -> int:
    """``litellm-disagg profile``: the profile as the YAML block for ``proxy_config.yaml`` on stdout, the measured
    points beside the fitted lines on stderr (``--json``: everything as one JSON object on stdout)."""
    import dataclasses
    import json
    import sys
    from pathlib import Path

    import httpx
    import yaml
    from pydantic import ValidationError

    from litellm_disagg.planner.mixing_check import FEW_REQUESTS, MixedLoad, MixingCheck, check_mixing, render_checks
    from litellm_disagg.planner.profile_fit import ProfileFitError, median_profile
    from litellm_disagg.planner.profiler import (
        ProfileError,
        ProfileTarget,
        load_profile,
        measure_profile,
        parse_sizes,
        plan_from,
        render_points,
        render_profile_yaml,
        served_model,
    )

    try:
        given = load_profile(Path(args.profile_file).read_text()) if args.profile_file else None
        if given is not None and not args.check_load:
            raise ValueError("--profile needs --check-load (a given profile is only checked)")
        if given is None and args.max_num_batched_tokens is None:
            raise ValueError("--max-num-batched-tokens is required to measure a profile")
        plan = None if given is not None else plan_from(
            args.max_num_batched_tokens, parse_sizes(args.batches) if args.batches else None, args.output_tokens,
            parse_sizes(args.prompt_tokens) if args.prompt_tokens else None, args.repeats)
        if args.runs < 1:
            raise ValueError(f"--runs must be at least 1, got {args.runs}")
        loads = [MixedLoad(requests_per_s=rate, prompt_tokens=args.check_prompt_tokens,
                           output_tokens=args.check_output_tokens,
                           seconds=args.check_seconds if args.check_seconds is not None else FEW_REQUESTS / rate)
                 for rate in parse_rates(args.check_load)] if args.check_load else []
        if not (0 < args.headroom < 1 and 0 < args.quantile < 1):
            raise ValueError("--headroom and --quantile must be between 0 and 1")
    except (ValueError, ValidationError, OSError, yaml.YAMLError) as exc:
        print(f"litellm-disagg profile: bad arguments: {exc}", file=sys.stderr)
        return 2
    target = ProfileTarget.of(args.url, args.model, args.api_key)

    async def measure() -> tuple[list[Any], Any, list[MixingCheck]]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout)) as client:
            fits = [] if plan is None else [await measure_profile(client, target, plan) for _ in range(args.runs)]
            profile = median_profile(fits) if given is None else given
            model = (await served_model(client, target)).name
            checks = [await check_mixing(client, target, model, profile, load, quantile=args.quantile,
                                         margin=args.headroom) for load in loads]
            if checks:
                # the checked profile: the planner starts from the largest correction the loads showed
                profile = profile.model_copy(update={"mixing_correction": max(c.correction for c in checks)})
            return fits, profile, checks

    try:
        fits, profile, checks = asyncio.run(measure())
    except (ProfileError, ProfileFitError, httpx.HTTPError) as exc:
        print(f"litellm-disagg profile: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1

    def run_json(fit: Any) -> dict[str, Any]:
        return {"engine_profile": fit.profile.model_dump(),
                "decode": dataclasses.asdict(fit.decode), "prefill": dataclasses.asdict(fit.prefill),
                "decode_points": [dataclasses.asdict(p) for p in fit.decode_points],
                "prefill_points": [dataclasses.asdict(p) for p in fit.prefill_points],
                "warnings": list(fit.warnings())}

    if args.json:
        # the top level: the median profile, and the first run's lines and points (one run: that run's everything)
        print(json.dumps({**(run_json(fits[0]) if fits else {}), "engine_profile": profile.model_dump(),
                          "runs": [run_json(fit) for fit in fits], "mixing_checks": [c.as_json() for c in checks]}))
    else:
        for i, fit in enumerate(fits, 1):
            if len(fits) > 1:
                sys.stderr.write(f"run {i} of {len(fits)}:\n")
            sys.stderr.write(render_points(fit))
            sys.stderr.writelines(f"warning: {line}\n" for line in fit.warnings())
        if len(fits) > 1:
            sys.stderr.write(f"the profile below: each number's median over the {len(fits)} runs\n")
        if checks:
            sys.stderr.write(render_checks(checks))
        sys.stdout.write(render_profile_yaml(profile))
    return 0


def parse_rates(text: str) -> list[float]:
    """'0.5,1' -> [0.5, 1.0]; each above 0."""
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(f"--check-load: not a comma-separated list of rates: {text!r}") from exc
    if not rates or any(r <= 0 for r in rates):
        raise ValueError(f"--check-load: rates must be above 0: {text!r}")
    return rates
