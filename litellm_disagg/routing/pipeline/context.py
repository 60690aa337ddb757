"""The scoring context: what the scorers know about one request and the candidates' state, built once per decision.

- ``WorkerLoad``: one immutable load snapshot per worker (a named tuple: 64 of them per decision must cost
  microseconds): this router's in-flight figures (``Accounting``) and the engine's scraped metrics.
- ``ScoringContext``: the prompt's length, the cached tokens per worker (from the KV prefix index, when KV-aware
  routing is on; else empty), the loads, and the live sessions per worker (prefixes each recently served that may
  come back: ``routing/kv/live_sessions.py``; empty without KV-aware routing).
- ``collect_loads``: the snapshot of many workers at one instant; ``LoadCache``: the same snapshot kept from one
  decision to the next while neither source changed (a router's ``Accounting`` and ``LoadScraper`` count their
  changes) and no figure in it is due to age, with each worker's ``figures`` (the ``WorkerLoad`` properties the
  scorers read) computed once per snapshot instead of per candidate and decision.

Context providers (``providers.py``) build it; scorers only read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.kv.load_scraper import NOT_SCRAPED, ScrapedLoad
from litellm_disagg.routing.replica_slot import ReplicaSlot
from litellm_disagg.runtime_config import RuntimeConfig

if TYPE_CHECKING:
    from litellm_disagg.routing.kv.load_scraper import LoadScraper


class WorkerLoad(NamedTuple):
    worker_id: str
    kv_capacity_blocks: int
    inflight_requests: int = 0
    """Requests this router has in flight there (with the other proxy replicas', where they share them through
    Redis: ``routing/shared_inflight.py``; so are the figures below)."""
    inflight_prefill_tokens: int = 0
    """Prompt tokens this router sent there that are still being prefilled."""
    inflight_decode_blocks: int = 0
    """KV blocks of the requests this router has decoding there."""
    scraped: ScrapedLoad = NOT_SCRAPED
    inflight_pull_tokens: int = 0
    """Prompt tokens whose KV this router's remote prefills will move there, not yet arrived (its decodes prefilled
    remotely, before their first token). Last, so positional snapshots without it still build."""

    # The properties below spell ``max(a, b)`` as ``b if b > a else a``: the same value (``max`` keeps the first of
    # equal values and never prefers a NaN second argument) without a builtin call; dozens run per decision.

    @property
    def active_requests(self) -> float:
        """Requests running or queued there: the larger of the router's count and the engine's (which also sees
        other routers' requests, but lags by up to a scrape interval). Where the scraper records
        ``ScrapedLoad.counted_at_scrape`` (``kv_routing.load.advance_scrapes``), the engine's count is moved by what
        the router started there and saw end since the scrape, so a worker whose requests just ended reads idle at
        once, not a scrape later."""
        scraped = self.scraped
        ours = float(self.inflight_requests)
        if scraped.stale:
            return ours
        engine = scraped.running + scraped.waiting
        then = scraped.counted_at_scrape
        if then is not None:
            engine += ours - then
        return engine if engine > ours else ours

    @property
    def used_blocks(self) -> float:
        """KV blocks in use: the larger of the router's in-flight decode blocks and the engine's reported usage."""
        scraped = self.scraped
        engine = 0.0 if scraped.stale else scraped.kv_usage * self.kv_capacity_blocks
        ours = float(self.inflight_decode_blocks)
        return engine if engine > ours else ours

    @property
    def free_kv_fraction(self) -> float:
        capacity = self.kv_capacity_blocks
        if capacity <= 0:
            return 0.0
        free = 1.0 - self.used_blocks / capacity
        return free if free > 0.0 else 0.0


Figures = tuple[float, float, float, int]
"""``figures(load)``: (active requests, used blocks, free KV fraction, in-flight prefill tokens)."""


def figures(load: WorkerLoad) -> Figures:
    """What the scorers read of one load, in one tuple: its properties computed once."""
    return (load.active_requests, load.used_blocks, load.free_kv_fraction, load.inflight_prefill_tokens)


@dataclass(frozen=True)
class ScoringContext:
    """What the scorers know about one request and the candidates' state."""

    prompt_tokens: int
    cached_tokens: Mapping[str, int]
    """Per worker: leading prompt tokens its prefix cache can serve (``usable_cached_tokens``); absent means 0."""
    loads: Mapping[str, WorkerLoad]
    live_sessions: Mapping[str, float] = field(default_factory=dict)
    """Per worker: prefixes it served within the sessions window that were not continued elsewhere (absent: 0)."""
    next_turns: Mapping[str, float] | None = None
    """With ``sessions.expect: next_turns``: per worker, the next turns it is expected to get while this prompt would
    be computed there (absent: 0; computed on first read). None: not asked for."""
    figures: Mapping[str, Figures] | None = field(default=None, compare=False, repr=False)
    """Per worker in ``loads`` (some or all): ``figures(loads[worker_id])``, precomputed (``LoadCache``). None:
    computed from ``loads`` when asked."""
    replica: ReplicaSlot | None = None
    """This proxy replica's slot among the live replicas (``Accounting.replica_slot``): the picker splits ties by it.
    None: a replica alone."""
    prefill_computed: Mapping[str, int] | None = None
    """Per worker: tokens of the prompts this router sent it that are estimated computed already, though their
    prefill is not yet seen over (``routing/kv/prefill_progress.py``, ``kv_routing.load.prefill_progress``; absent:
    0). The ``kv_cost`` scorer counts a worker's queued prefill less these. None: not estimated."""

    def queued_prefill_tokens(self, worker_id: str, queued: int) -> int:
        """A worker's queued prefill tokens (``queued``: its in-flight figure) less those estimated computed."""
        computed = self.prefill_computed
        if not computed:
            return queued
        left = queued - computed.get(worker_id, 0)
        return left if left > 0 else 0

    def cached(self, worker_id: str) -> int:
        return self.cached_tokens.get(worker_id, 0)

    def load(self, worker: RuntimeConfig) -> WorkerLoad:
        found = self.loads.get(worker.worker_id)
        return found if found is not None else WorkerLoad(worker.worker_id, worker.kv_capacity_blocks)

    def loads_of(self, candidates: Sequence[RuntimeConfig]) -> list[WorkerLoad]:
        """``[load(w) for w in candidates]``, in one pass."""
        get = self.loads.get
        return [
            found if (found := get(w.worker_id)) is not None else WorkerLoad(w.worker_id, w.kv_capacity_blocks)
            for w in candidates
        ]

    def figures_of(self, candidates: Sequence[RuntimeConfig]) -> list[Figures]:
        """``[figures(load(w)) for w in candidates]``, from the precomputed ``figures`` where they are given."""
        known = self.figures
        if known is None:
            return [figures(load) for load in self.loads_of(candidates)]
        get = known.get
        return [f if (f := get(w.worker_id)) is not None else figures(self.load(w)) for w in candidates]


def usable_cached_tokens(cached_blocks: int, block_size: int, prompt_tokens: int) -> int:
    """Tokens a worker holding ``cached_blocks`` leading blocks can skip: vLLM computes at least the last prompt
    token, so a hit never covers the prompt's last block when the prompt fills it exactly."""
    if prompt_tokens <= 0:
        return 0
    limit = (prompt_tokens - 1) // block_size
    return (limit if limit < cached_blocks else cached_blocks) * block_size  # min(cached_blocks, limit)


def collect_loads(
    candidates: Iterable[RuntimeConfig],
    *,
    accounting: Accounting | None = None,
    scraped: Mapping[str, ScrapedLoad] | Callable[[str], ScrapedLoad] | None = None,
) -> dict[str, WorkerLoad]:
    """One snapshot per candidate, from whichever sources are given (``scraped``: a mapping, or a lookup such as
    ``LoadScraper.lookup()``)."""
    if scraped is None:
        lookup: Callable[[str], ScrapedLoad] = _not_scraped
    elif isinstance(scraped, Mapping):
        lookup = lambda wid: scraped.get(wid, NOT_SCRAPED)  # noqa: E731
    else:
        lookup = scraped
    if accounting is not None:
        requests_of, prefill_of, decode_of = accounting.lookups()
        pull_of = accounting.pull_lookup()
    else:
        requests_of = prefill_of = decode_of = pull_of = _zero
    # ``tuple.__new__`` builds the same named tuple as ``WorkerLoad(...)`` without the Python-level ``__new__`` that
    # namedtuple generates (64 snapshots per decision).
    make = tuple.__new__
    out: dict[str, WorkerLoad] = {}
    for worker in candidates:
        wid = worker.worker_id
        out[wid] = make(
            WorkerLoad,
            (
                wid,
                worker.kv_capacity_blocks,
                requests_of(wid, 0),
                prefill_of(wid, 0),
                decode_of(wid, 0),
                lookup(wid),
                pull_of(wid, 0),
            ),
        )
    return out


def _zero(_worker_id: str, default: int) -> int:
    return default


def _not_scraped(_worker_id: str) -> ScrapedLoad:
    return NOT_SCRAPED


class LoadCache:
    """A router's load snapshot (``collect_loads`` over its accounting and scraper) and every worker's ``figures``,
    kept from one decision to the next while it cannot have changed: the accounting's and the scraper's ``version``
    are the same (each counts its changes; the accounting's expiry runs first, as ``collect_loads`` runs it), the
    clock has not gone back, and no scraped figure in it has aged past ``stale_after_s`` (the oldest one is checked
    with the scraper's own comparison; a later scrape is younger). A candidate the snapshot lacks (or whose KV
    capacity changed) is added from a fresh lookup. So every decision sees what ``collect_loads`` would return at
    that instant, for its candidates (the mapping may hold other workers too; scorers only look up candidates)."""

    def __init__(self, accounting: Accounting, scraper: LoadScraper):
        self._accounting = accounting
        self._scraper = scraper
        self._key: tuple[int, int] | None = None
        self._at = 0.0
        self._oldest: float | None = None
        """The oldest ``scraped_at`` of a not-stale scraped load in the snapshot."""
        self._loads: dict[str, WorkerLoad] = {}
        self._figures: dict[str, Figures] = {}

    def snapshot(self, candidates: Sequence[RuntimeConfig]) -> tuple[dict[str, WorkerLoad], dict[str, Figures]]:
        """``(loads, figures)`` for at least ``candidates``. The mappings are not changed afterwards but for workers
        added to them (a new snapshot is a new mapping), so a context built on them stays as it was."""
        accounting, scraper = self._accounting, self._scraper
        accounting.expire()
        now = scraper.now()
        key = (accounting.version, scraper.version)
        oldest = self._oldest
        if key != self._key or now < self._at or (oldest is not None and now - oldest > scraper.stale_after_s):
            self._key, self._at, self._oldest = key, now, None
            self._loads, self._figures = {}, {}
        get = self._loads.get
        missing = [w for w in candidates if (found := get(w.worker_id)) is None or found[1] != w.kv_capacity_blocks]
        if missing:
            self._add(missing)
        return self._loads, self._figures

    def _add(self, missing: list[RuntimeConfig]) -> None:
        loads, figs = self._loads, self._figures
        if any(w.worker_id in loads for w in missing):  # a capacity changed: a new mapping, older contexts keep theirs
            loads, figs = self._loads, self._figures = dict(loads), dict(figs)
        oldest = self._oldest
        for wid, load in collect_loads(missing, accounting=self._accounting, scraped=self._scraper.lookup()).items():
            loads[wid] = load
            figs[wid] = figures(load)
            scraped = load.scraped
            if not scraped.stale and (oldest is None or scraped.scraped_at < oldest):
                oldest = scraped.scraped_at
        self._oldest = oldest
