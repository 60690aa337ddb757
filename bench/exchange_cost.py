"""``python -m bench.exchange_cost``: what one in-flight exchange between proxy replicas costs the proxy.

Starts a ``redis-server`` on a free port (Debian's, as the tests do), joins ``--replicas`` replicas to the exchange
(``routing/shared_inflight.py``), each with requests in flight on ``--workers`` workers, then times ``--exchanges``
round trips of one replica (publish its totals, read and sum the others') and prints this process's CPU and the
wall time per exchange, per round. With ``shared_inflight.interval_s`` it gives the proxy's CPU share of the
exchange; docs/benchmarks.md ("A shorter exchange interval") quotes it.

    .venv/bin/python -m bench.exchange_cost [--replicas 4] [--workers 8] [--exchanges 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.serving.redis_server import redis_server
from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.shared_inflight import SharedInflight, SharedInflightSettings


@dataclass(frozen=True)
class ExchangeCost:
    cpu_s: float
    """This process's CPU (user + system) per exchange."""
    wall_s: float


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(port: int, *, replicas: int, workers: int, exchanges: int) -> ExchangeCost:
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=port)
    try:
        loops = []
        for r in range(replicas):
            accounting = Accounting()
            for w in range(workers):
                accounting.start(FlightKey.decode(f"r{r}-w{w}"), f"worker-{w}", prefill_tokens=512, decode_blocks=32)
            loops.append(SharedInflight(accounting, lambda: client, SharedInflightSettings(), replica=f"replica-{r}"))
        for loop in loops:  # every replica's field is there before the timing
            await loop.exchange()
        timed = loops[0]
        cpu, wall = _cpu_s(), time.perf_counter()
        for _ in range(exchanges):
            if not await timed.exchange():
                raise RuntimeError("an exchange failed")
        return ExchangeCost((_cpu_s() - cpu) / exchanges, (time.perf_counter() - wall) / exchanges)
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.exchange_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--exchanges", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="exchange-cost-") as directory, redis_server(Path(directory)) as port:
        for n in range(1, args.rounds + 1):
            cost = asyncio.run(measure(port, replicas=args.replicas, workers=args.workers, exchanges=args.exchanges))
            share = cost.cpu_s / SharedInflightSettings().interval_s
            print(f"round {n}: one exchange ({args.replicas} replicas x {args.workers} workers) "
                  f"{cost.cpu_s * 1e6:.0f} us CPU, {cost.wall_s * 1e6:.0f} us wall; "
                  f"{share:.1%} of a core at the default interval", flush=True)


if __name__ == "__main__":
    main()
