"""KVRoutingSettings: every knob of KV-aware routing, with its default, in one place.

It is meant to sit under ``litellm_disagg: kv_routing:`` in ``proxy_config.yaml`` (see this package's README for an
example). Unknown keys are refused, so a misspelt knob fails loudly at start-up.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from litellm_disagg.routing.pipeline.profile import ProfileSettings, kv_decode_profile, kv_prefill_profile

NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IndexSettings(_Strict):
    mode: Literal["precise", "approximate"] = "precise"
    """``precise``: workers that publish KV events (``kv_events_endpoint``) are indexed from them; workers that do not
    are indexed approximately. ``approximate``: never subscribe; every worker is indexed from routing decisions."""
    approximate_ttl_s: Positive = 120.0
    """Approximate entries expire this long after the router last sent those blocks to the worker."""
    predicted_ttl_s: Positive = 30.0
    """Longest a precise worker's predicted entry (routed, ``BlockStored`` not yet seen) counts. The event normally
    replaces it much sooner; this only bounds a prediction whose request failed."""
    max_blocks_per_worker: Annotated[int, Field(ge=1)] | None = None
    """Bound of each worker's LRU; default: the worker's own ``kv_capacity_blocks``."""
    maintain_interval_s: Positive = 0.1
    """How often expiry and the release of departed workers' entries run (off the request path)."""
    maintain_max_items: Annotated[int, Field(ge=1)] = 50_000
    """At most this many entries released per maintenance run (bounds the time one run holds the event loop)."""


class EventSettings(_Strict):
    topic: str = ""
    """ZMQ subscription prefix; empty: everything the worker publishes."""
    on_gap: Literal["keep", "clear"] = "keep"
    """Lost batches: ``keep`` the worker's entries (they age out through the LRU bound) or ``clear`` them."""
    media: tuple[str, ...] = ("GPU",)
    """Which ``medium`` values count as held (events without a medium always do)."""
    kv_group: Annotated[int, Field(ge=0)] = 0
    """The KV cache group whose events are applied (0: the full-attention group of ordinary models)."""
    rcvhwm: Annotated[int, Field(ge=1)] = 100_000
    reconnect_interval_s: Positive = 0.1
    reconnect_interval_max_s: Positive = 5.0
    heartbeat_s: Positive = 2.0


class TokenizerSettings(_Strict):
    model_dirs: dict[str, str] = Field(default_factory=dict)
    """Served model name -> a directory (or hub id available offline) with its tokenizer and chat template, or
    ``python:MODULE:FACTORY`` for a tokenizer that is not a Hugging Face one (see ``tokenizer.py``)."""
    http_fallback: bool = True
    """For a model without a directory (or when local tokenization fails): ask a worker's ``POST /tokenize``."""
    timeout_s: Positive = 2.0
    """Timeout of one ``/tokenize`` call; past it the request is routed on load alone."""
    max_cached_tokenizers: Annotated[int, Field(ge=1)] = 8
    max_cached_tokens: Annotated[int, Field(ge=0)] = 1_000_000
    """Bound of the token cache, in tokens, shared by all local tokenizers. Chat prompts are tokenized per segment
    (cut before each special token of the template, e.g. each message's ``<|im_start|>``) and each segment's ids
    are cached by its text, so the next turn of a conversation only tokenizes its new messages (the ids are the same
    as a whole tokenization's: checked per tokenizer at load). The least recently used segments go first. Memory:
    about 40 bytes per cached token (the ids and the segment's text), so the default holds about 120 conversations
    of 8k tokens in about 40 MB. 0: no cache, every prompt is tokenized whole."""
    inline_max_new_chars: Annotated[int, Field(ge=0)] = 4096
    """A prompt whose segments are all in the token cache but at most this many characters (a conversation's next
    turn: its new messages) is tokenized on the event loop rather than in a worker thread, with the same ids: the
    thread hand-off cost more than the work (0.3 ms p50 and several ms p99 on a busy 2-core machine, against about
    0.2 ms of lookups and joining for an 8k-token turn, which holds the GIL in a thread too). Anything larger, a
    tokenizer busy in another thread, or the first prompts of a tokenizer (verified against whole encoding) go to the
    thread as before. 0: always in a thread."""
    cache_answers: bool = True
    """When a chat answer completes (the plugin's success hook), render the conversation with it as the next turn
    will and put the answer's segments into the token cache, in a worker thread: the next turn then encodes only its
    new question on its critical path. Costs one render and the answer's encoding per completed chat, whether or not
    a next turn comes. Needs the token cache (``max_cached_tokens`` above 0)."""
    reuse_turns: bool = True
    """With ``cache_answers``: also keep the rendered conversation, its ids and its block hashes whole
    (``turn_prefix.py``, bounded by ``max_cached_tokens`` again), so that a next turn that starts with it (tokenized
    on the event loop) scans, looks up, joins and hashes only its new messages. The ids are the same either way."""
    piece_cache: bool = True
    """With the token cache: a new segment of printable ASCII is split as the tokenizer's own pre-tokenizer splits it
    and each piece's ids are cached (``piece_cache.py``), so a next turn's question costs dict lookups instead of a
    call into the tokenizer on cold caches (about 60 against 270 µs for 40 words). Byte-level BPE tokenizers only
    (GPT-2, SmolLM2, Llama 3, Qwen 2 style); checked against the tokenizer at load and on its first 16 texts. The ids
    are the same either way. About 250 bytes per cached piece, at most 100,000 pieces (25 MB) per tokenizer."""


class LoadSettings(_Strict):
    scrape_interval_s: Positive = 0.25
    scrape_timeout_s: Positive = 1.0
    stale_after_s: Positive = 2.0
    """Scraped values older than this (or from a failed scrape) are ignored; the router's own counts remain."""
    inflight_max_age_s: Positive = 900.0
    advance_scrapes: bool = False
    """Move a worker's scraped request count by the requests this router (every replica, where they share their
    counts) started there and saw end since that scrape: a prefill worker whose prompt finished a moment after the
    scrape reads idle at once instead of busy until the next scrape (up to ``scrape_interval_s``), when every
    replica would otherwise send its next cold prompt to the one worker the last scrape caught idle. Off by default
    since 2026-12-07: on one proxy over aggregated workers at a fifth of the simulator's speed it put more new
    conversations' cold prompts on workers whose own conversations were about to send their next turn (multi-turn
    TTFT p50 1.19-1.30x the oracle's against 1.04-1.06x off, 3 runs each); through four replicas its measured gain
    was one run in eleven (docs/benchmarks.md)."""
    prefill_progress: bool = True
    """Estimate how far each worker has got through the prompts this router sent it (``prefill_progress.py``: in the
    order sent, at a prefill rate fitted from the prefills seen over) and score its queued prefill by what is left,
    not by the whole of every prompt until its first token: of workers all busy with a cold prompt, the one nearest
    the end of its prompt is the cheapest. Off: every queued prompt counts whole until its prefill is seen over, and
    such a choice is a tie. On by default since 2026-12-07: skewed traffic on simulated workers at a fifth of their
    speed put 9 of 9 such cold prompts on the worker that finished first against 0 of 9 off, TTFT p99 1,340-1,355 ms
    against 1,451-1,618 (3 runs each); multi-turn and 4P+4D P/D no different (docs/benchmarks.md)."""


class DisaggDecisionSettings(_Strict):
    """Conditional disaggregation: remote prefill or local prefill on the decode worker, per request."""

    mode: Literal["auto", "always", "never"] = "auto"
    """``always``: every splittable request prefills remotely (the behaviour without this feature); ``never``: the
    decode worker prefills; ``auto``: the cost model decides (or ``min_remote_prefill_tokens`` when set)."""
    min_remote_prefill_tokens: Annotated[int, Field(ge=0)] | None = None
    """Operator override of the cost model: remote iff the tokens the decode worker lacks are at least this."""
    prior_prefill_tokens_per_s: Positive = 10_000.0
    prior_prefill_overhead_s: NonNegative = 0.02
    prior_transfer_tokens_per_s: Positive = 200_000.0
    prior_transfer_overhead_s: NonNegative = 0.005
    """Priors for the online estimates, used until observations replace them."""
    halflife_observations: Positive = 50.0
    """Older observations weigh half as much after this many newer ones."""
    estimate_ttl_s: Positive | None = 60.0
    """An estimate with no new observation for this long goes back to its prior (None: estimates never expire).
    Observations come only from remote prefills, so a line that once looked slow (a cold engine's first request, a
    first NIXL handshake) would otherwise keep every request local, and so unobserved, for good."""
    unobserved_halflife_requests: Positive | None = 32.0
    """While requests keep taking the other path, a path's fitted lines move halfway back to their priors (where those
    are cheaper) every this many requests (local: its first-token line; remote: the prefill, transfer and remote-tail
    lines), and their old observations weigh that much less against the path's next one. A path priced on a few slow
    observations (a cold start, a busy moment) is tried again, sooner the closer it is to winning, and a fast
    observation then corrects it; ``estimate_ttl_s`` alone let it rule for its whole length. None: off (the TTL
    alone)."""
    decode_time_weight: NonNegative = 1.0
    """Cost of one second the decode worker spends prefilling, on top of the request's own wait, per request it
    delays (the request's decode slot counts as one, plus each running request): time taken from decoding. With
    ``fit_decode_time_weight``, the prior until measured."""
    fit_decode_time_weight: bool = True
    """Measure ``decode_time_weight`` from the streams' inter-token gaps with and without a local prefill on their
    worker (``stall_fit.py``: ``1 - base gap / gap during a prefill``) once ``stall_min_gaps`` of each are seen."""
    stall_min_gaps: Annotated[int, Field(ge=1)] = 10
    """Gaps of each kind before the measured weight replaces the prior (a 16-request run on real CPU engines sees a
    few dozen gaps during local prefills)."""
    stall_halflife_gaps: Positive = 200.0
    """Older inter-token gaps weigh half as much after this many newer ones of the same kind."""
    local_prefill_speed: Positive = 1.0
    """The decode worker's prefill speed relative to a prefill worker's (1: same hardware and model)."""
    shared_compute: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    """The share of a remote prefill's compute that the decode workers lose: 0 when each worker has hardware of its
    own; 1 when the engines time-share the same cores or GPU (several engines on one GPU); between for CPU engines
    whose threads outnumber the cores (``1 - cores / engine threads``: 3 one-thread engines on 2 cores, 1/3).
    ``litellm-disagg up`` computes it for what it starts (``stack_config.shared_compute_share``) unless the config
    sets it. That share of the ``decode_time_weight`` charge is added to the remote option, so remote wins where it
    saves the decode side compute, not merely because a prompt is long. ``true`` means 1."""


class KVRoutingSettings(_Strict):
    """The ``kv_routing:`` section."""

    enabled: bool = False
    index: IndexSettings = IndexSettings()
    events: EventSettings = EventSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    load: LoadSettings = LoadSettings()
    prefill: ProfileSettings = Field(default_factory=kv_prefill_profile)
    decode: ProfileSettings = Field(default_factory=kv_decode_profile)
    disaggregation: DisaggDecisionSettings = DisaggDecisionSettings()
    seed: int | None = None
    """Seed of the pickers' tie-break and sampling randomness (None: from the OS)."""
