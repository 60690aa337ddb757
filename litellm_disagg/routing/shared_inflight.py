"""In-flight load shared between proxy replicas through Redis (LiteLLM's own, or one named here).

Each replica counts only the requests it sent (``accounting.py``). Behind one address, N replicas each see 1/N of
the traffic: until a worker's own ``/metrics`` shows the others' requests (a scrape interval later, and never a
decode whose prompt is still being prefilled elsewhere), a replica can pile new work onto a worker the others just
loaded. So every ``interval_s`` each replica, in one round trip (``redis_exchange.py``: a Lua script on one hash
key, so a Redis Cluster serves it too):

- writes its own per-worker totals (``Accounting.own_totals``) under its replica id, stamped with Redis's clock;
- reads the other replicas' fields, dropping (and deleting) those older than ``ttl_s``: a replica that died stops
  counting within ``ttl_s``, and no replica's clock matters;

and hands their sum to ``Accounting.set_others``, which every decision's load snapshot then adds to its own counts.
A replica that sends a prompt to be computed also exchanges at once (``publish_prompts_at_once``; at most once
between two ticks), and that exchange wakes the others (a message on ``<key>:wake``, published by the same script),
who exchange at once too: another replica placing a prompt sees it a few round trips later, not up to two intervals.
A field that does not parse, or holds a negative or absurd figure, is skipped and logged: another replica's entry is
never trusted. When Redis cannot be reached the others' totals are dropped once the last good read is ``ttl_s`` old
(routing goes on with this replica's own counts, as without Redis). On stop the replica deletes its field.

``enabled: auto`` (the default) turns this on when the LiteLLM router has a Redis (``router_settings``'
``redis_host``/``redis_port``/``redis_password`` or ``redis_url``, as LiteLLM's own multi-instance setup asks), and
uses the router's client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from litellm_disagg.observability import metrics as m
from litellm_disagg.routing.accounting import Accounting, WorkerFlights
from litellm_disagg.routing.redis_exchange import ExchangeLoop, RedisExchange, replica_id, router_redis
from litellm_disagg.routing.replica_slot import slot_of

logger = logging.getLogger(__name__)

MAX_FIGURE = 1 << 40
"""A figure above this (requests, tokens or blocks on one worker) is not believed."""


class SharedInflightSettings(BaseModel):
    """``litellm_disagg.shared_inflight`` in ``proxy_config.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool | Literal["auto"] = "auto"
    """``auto``: on when the LiteLLM router has a Redis (``router_settings.redis_host``... or ``redis_url``)."""
    redis_url: str | None = None
    """A Redis of its own (``redis://[:password@]host:port/db``); default: the LiteLLM router's."""
    key: Annotated[str, Field(min_length=1)] = "litellm_disagg:inflight"
    """The Redis hash the replicas share (one per cluster of proxies routing the same workers)."""
    interval_s: Annotated[float, Field(gt=0)] = 0.02
    """How often a replica publishes its totals and reads the others'. A replica's request is unseen by the others
    for up to two intervals (its next publish, their next read; a prompt to compute a few round trips, with
    ``publish_prompts_at_once``): shorter than a prefill, or two replicas can send
    prompts arriving together to the same idle-looking prefill worker (docs/benchmarks.md, "cold prompts colliding
    on a prefill worker": on the simulator's 4P+4D through four replicas, at 0.1 s they computed more of the prompts
    than one proxy does in 6 of 9 runs, at 0.02 s in 1 of 9). Each tick is one Redis round trip, about 0.24 ms of the
    proxy's CPU (4 replicas, 8 workers): about 1.2% of a core at 0.02 s."""
    publish_prompts_at_once: bool = True
    """A prompt this replica sends to be computed (a prefill, or a local prefill on a decode worker) is published at
    once rather than at the next tick, and wakes the other replicas (Redis pub/sub on ``<key>:wake``), who read it at
    once (``ExchangeLoop.nudge``; each at most once between two ticks): they see it a few round trips later instead
    of up to two intervals. Costs each replica at most one more round trip per interval, and one subscription; a
    replica whose last exchange found no other one makes no early exchange (a newcomer reads it at its next tick)."""
    spread_ties: bool = True
    """Split ties between the replicas (``replica_slot.py``): each draws a tie among equally good workers from its own
    share of them (the live replicas' ids in order give each a rank), so two replicas placing cold prompts at the
    same moment, before either has heard of the other's, pick different idle workers. Costs nothing per decision but
    a sort of the tied workers."""
    ttl_s: Annotated[float, Field(gt=0)] = 2.0
    """A replica not heard from for this long no longer counts (it died, or cannot reach Redis)."""
    estimates: bool = True
    """With KV routing, also pool the local-or-remote prefill decision's measurements (``kv/shared_estimates.py``):
    each replica then fits its cost lines on every replica's observations, not on its own share of them."""
    estimates_key: Annotated[str, Field(min_length=1)] = "litellm_disagg:estimates"
    estimates_interval_s: Annotated[float, Field(gt=0)] = 1.0
    """How often a replica publishes its measurements and reads the others' (they move over many requests)."""

    @property
    def estimates_ttl_s(self) -> float:
        """A replica's measurements count this long after it last published them."""
        return max(self.ttl_s, 3 * self.estimates_interval_s)

    @model_validator(mode="after")
    def _ttl_spans_intervals(self) -> SharedInflightSettings:
        if self.ttl_s < 2 * self.interval_s:
            raise ValueError("shared_inflight.ttl_s must be at least twice interval_s")
        return self


def encode(totals: dict[str, WorkerFlights]) -> str:
    return json.dumps(
        {wid: [f.requests, f.prefill_tokens, f.decode_blocks, f.pull_tokens] for wid, f in totals.items()},
        separators=(",", ":"),
    )


def _figures(value: Any) -> WorkerFlights | None:
    if not isinstance(value, list) or len(value) != 4:
        return None
    if not all(type(v) is int and 0 <= v <= MAX_FIGURE for v in value):
        return None
    return WorkerFlights(*value)


def parse_others(entries: list[tuple[str, str]]) -> tuple[dict[str, WorkerFlights], list[str]]:
    """The other replicas' ``(field, totals)`` -> their totals summed per worker, and the replicas whose field was
    skipped whole or in part (unreadable, or a figure that is not a count)."""
    summed: dict[str, list[int]] = {}
    bad: list[str] = []
    for field, payload in entries:
        try:
            totals = json.loads(payload)
        except ValueError:
            bad.append(field)
            continue
        if not isinstance(totals, dict):
            bad.append(field)
            continue
        skipped = False
        for wid, value in totals.items():
            figures = _figures(value)
            if figures is None or not isinstance(wid, str) or not wid:
                skipped = True
                continue
            into = summed.setdefault(wid, [0, 0, 0, 0])
            into[0] += figures.requests
            into[1] += figures.prefill_tokens
            into[2] += figures.decode_blocks
            into[3] += figures.pull_tokens
        if skipped:
            bad.append(field)
    return {wid: WorkerFlights(*v) for wid, v in summed.items()}, bad


class SharedInflight(ExchangeLoop):
    """One replica's side of the exchange (see the module's docstring)."""

    what = "shared in-flight"
    fallback = "routing on this replica's own counts"

    def __init__(
        self,
        accounting: Accounting,
        client: Callable[[], Any | None],
        settings: SharedInflightSettings,
        *,
        replica: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        hash_ = RedisExchange(client, key=settings.key, replica=replica or replica_id(), ttl_s=settings.ttl_s,
                              timeout_s=max(settings.ttl_s / 2, settings.interval_s))
        super().__init__(hash_, interval_s=settings.interval_s, logger=logger, clock=clock)
        self.accounting = accounting
        self.client = client
        """Returns the Redis client, or None while there is none yet (LiteLLM may attach its Redis later)."""
        self.settings = settings
        self._owned: Any = None
        """A client of its own (``redis_url``), closed on stop; LiteLLM's is LiteLLM's to close."""
        if settings.publish_prompts_at_once:  # a prompt to compute is published at once and wakes the others
            accounting.on_prefill_queued = self.nudge
            self.wake_channel = f"{settings.key}:wake"

    @classmethod
    def for_router(cls, settings: SharedInflightSettings, router: Any, accounting: Accounting) -> SharedInflight | None:
        """The exchange these settings ask for, or None when it is off (``auto`` without a Redis on the router)."""
        if settings.enabled is False:
            return None
        if settings.redis_url is not None:
            import redis.asyncio as aioredis

            own = aioredis.Redis.from_url(settings.redis_url)
            shared = cls(accounting, lambda: own, settings)
            shared._owned = own
            return shared
        if settings.enabled == "auto" and getattr(getattr(router, "cache", None), "redis_cache", None) is None:
            return None
        return cls(accounting, router_redis(router), settings)

    def start(self) -> None:
        if self._task is None:
            logger.info("sharing in-flight load through Redis (key %s, replica %s)", self.settings.key, self.replica)
        super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._owned is not None:
            with contextlib.suppress(Exception):
                await self._owned.aclose()

    def payload(self) -> str:
        return encode(self.accounting.own_totals())

    def take(self, entries: list[tuple[str, str]]) -> list[str]:
        others, bad = parse_others(entries)
        self.accounting.set_others(others)
        if self.settings.spread_ties:
            self.accounting.replica_slot = slot_of(self.replica, (field for field, _ in entries))
        m.SHARED_INFLIGHT_UP.set(1)
        m.SHARED_INFLIGHT_REPLICAS.set(len(entries))
        m.SHARED_INFLIGHT_REQUESTS.set(sum(f.requests for f in others.values()))
        return bad

    def failed(self) -> None:
        m.SHARED_INFLIGHT_UP.set(0)

    def forget(self) -> None:
        self.accounting.set_others({})
        self.accounting.replica_slot = None
        m.SHARED_INFLIGHT_REPLICAS.set(0)
        m.SHARED_INFLIGHT_REQUESTS.set(0)
