"""Every Prometheus metric litellm-disagg's proxy plugin exports, defined here and nowhere else.

They live in prometheus_client's default registry, so they appear on the LiteLLM proxy's ``/metrics`` when its
Prometheus integration is on (``litellm_settings: callbacks: [..., "prometheus"]``), or on ``metrics.port`` when that
is set (``observability/serve.py``). Labels are bounded: ``model`` (a served model name), ``role`` (``prefill``,
``decode``, ``both``), ``worker`` (a worker id from discovery; series of departed workers are removed), ``mode``
(``MODES``) and the fixed reason and cause sets below. No request ids, no prompt data. Who sets what:
``observability/requests.py`` (per request, called by the routing strategy and the plugin's hooks),
``observability/pool_metrics.py`` (pool, workers, KV index, transfers: refreshed by the controller),
``routing/orchestrator.py`` (modes, failovers, fallbacks), ``discovery/status.py`` (discovery).

===================================================== ========= ========================= =================================================
name                                                  type      labels                    meaning
===================================================== ========= ========================= =================================================
**requests**
litellm_disagg_requests_total                         counter   model, mode               requests routed, by how their prompt was computed
litellm_disagg_time_to_first_token_seconds            histogram model, mode               streamed requests: routing began -> first chunk
litellm_disagg_inter_token_latency_seconds            histogram model, mode               streamed requests: gap between consecutive chunks
litellm_disagg_request_duration_seconds               histogram model, mode               routing began -> last chunk / success (end to end)
litellm_disagg_request_failures_total                 counter   model, mode, cause        routed requests that failed (cause: FAILURE_CAUSES)
litellm_disagg_route_seconds                          histogram model, mode               routing began -> decode call sent (selection,
                                                                                          remote prefill incl. its queue wait, failovers)
litellm_disagg_selection_seconds                      histogram model                     choosing the workers (the route plan) alone
litellm_disagg_prefill_duration_seconds               histogram model, worker             one successful remote prefill call
litellm_disagg_migrations_total                       counter   cause, outcome            a stream broken mid-answer, continued on another
                                                                                          decode worker (cause: MIGRATION_CAUSES; outcome:
                                                                                          MIGRATION_OUTCOMES; routing/migration.py)
**routing**
litellm_disagg_routed_total                           counter   model, role, worker       workers chosen (role: the pool it was chosen in)
litellm_disagg_prompt_tokens_total                    counter   model, role, worker       prompt tokens of those requests (KV routing on)
litellm_disagg_arrived_prompt_tokens_total            counter   model                     prompt tokens of each request when its workers are
                                                                                          chosen, before any prefill (KV routing on): the
                                                                                          demand the planner's load estimate reads
litellm_disagg_cached_prompt_tokens_total             counter   model, role, worker       of them, tokens the worker held in its prefix cache
litellm_disagg_local_prefills_total                   counter   model, reason             decode worker prefilled by choice (LOCAL_REASONS)
litellm_disagg_prefill_failovers_total                counter   model, worker, cause      prefill attempt failed, next tried (FAILOVER_CAUSES)
litellm_disagg_decode_aborts_total                    counter   worker                    decode ended: its concurrent prefill (SGLang) failed
litellm_disagg_aggregated_fallbacks_total             counter   model, cause              served aggregated for lack of a prefill
                                                                                          (FALLBACK_CAUSES); 0 from the model's first sight
litellm_disagg_prefill_cost_estimate_seconds          histogram model, option             the remote-or-local decision's estimated time to
                                                                                          the prompt computed, per request (option: remote,
                                                                                          local; KV routing's cost model, auto mode)
litellm_disagg_prefill_backlog_tokens                 histogram model, option             prompt tokens already waiting to be prefilled
                                                                                          that the decision priced ahead of the request
                                                                                          (option: remote, the prefill worker's backlog;
                                                                                          local, the decode worker's own local prefills)
litellm_disagg_cost_model_tokens_per_second           gauge     phase                     KV routing's fitted rate (phase: prefill, transfer,
                                                                                          local, remote_tail; progress: prefill_progress.py)
litellm_disagg_cost_model_overhead_seconds            gauge     phase                     KV routing's fitted fixed cost per call
litellm_disagg_cost_model_decode_time_weight          gauge     source                    the stall charge's weight in use (source: fitted from
                                                                                          inter-token gaps, or prior)
litellm_disagg_cost_model_decode_gap_seconds          gauge     kind                      the stall fit's mean inter-token gap (kind: base,
                                                                                          during: a local prefill on the worker)
litellm_disagg_cost_model_decode_gaps                 gauge     kind                      inter-token gaps the stall fit has seen, per kind
**pools and workers** (refreshed every ``sync_interval_s``)
litellm_disagg_workers                                gauge     model, role, state        workers discovery lists (state: starting, ready,
                                                                                          draining)
litellm_disagg_worker_state                           gauge     model, role, worker,      1 for the worker's current state
                                                                state
litellm_disagg_worker_cooling_down                    gauge     model, role, worker       1 while in failure cooldown (gets no new work)
litellm_disagg_worker_inflight_requests               gauge     model, role, worker       calls this proxy process has in flight there
litellm_disagg_worker_queued_prefill_tokens           gauge     model, role, worker       prompt tokens this process sent there, not yet
                                                                                          prefilled
litellm_disagg_worker_running_requests                gauge     model, role, worker       engine's running batch (scraped; KV routing on)
litellm_disagg_worker_waiting_requests                gauge     model, role, worker       engine's queue (scraped; KV routing on)
litellm_disagg_worker_kv_usage_ratio                  gauge     model, role, worker       engine's KV cache in use, 0..1 (scraped; KV
                                                                                          routing on)
**Other proxy replicas** (in-flight counts shared through Redis, ``routing/shared_inflight.py``)
litellm_disagg_shared_inflight_up                     gauge     (none)                    1 while the exchange through Redis succeeds
litellm_disagg_shared_inflight_replicas               gauge     (none)                    other replicas heard in the last exchange
litellm_disagg_shared_inflight_requests               gauge     (none)                    calls the other replicas have in flight
**KV transfers** (the decode workers' NIXL counters, scraped; KV routing on)
litellm_disagg_kv_transfers_total                     counter   model, worker             KV transfers the decode worker completed
litellm_disagg_kv_transfer_seconds_total              counter   model, worker             their durations, added up (mean = ratio of rates)
litellm_disagg_kv_transfer_tokens_total               counter   model, worker             prompt tokens that arrived by transfer
litellm_disagg_kv_transfer_bytes_total                counter   model, worker             bytes moved (where the engine reports them)
**KV index** (KV routing on)
litellm_disagg_kv_index_blocks                        gauge     kind                      index size (kind: held, distinct, predicted,
                                                                                          pending_release)
litellm_disagg_kv_index_workers                       gauge     (none)                    workers in the index
litellm_disagg_kv_event_batches_total                 counter   worker                    KV event batches applied
litellm_disagg_kv_event_gaps_total                    counter   worker                    sequence gaps (lost batches) seen
litellm_disagg_kv_event_lag_seconds                   gauge     worker                    engine timestamp -> applied, last batch
litellm_disagg_kv_event_last_applied_timestamp_seconds gauge    worker                    when the last batch was applied (unix time)
**discovery**
litellm_disagg_discovery_up                           gauge     (none)                    1 while discovery answers, 0 while it does not
litellm_disagg_discovery_last_success_timestamp_seconds gauge   (none)                    last successful read (staleness: time() - this)
litellm_disagg_discovery_last_change_timestamp_seconds  gauge   (none)                    last time the worker list changed
**planner** (set by the planner, ``planner/report.py``, docs/planner.md)
litellm_disagg_planner_enabled                        gauge     (none)                    1 while a planner runs in this process, else 0
litellm_disagg_planner_leader                         gauge     (none)                    1 while this process's planner holds the lock (acts)
litellm_disagg_planner_desired_workers                gauge     model, role               workers of role prefill/decode/both it wants (NaN: no planner)
litellm_disagg_planner_decisions_total                counter   model, action             planner actions (PLANNER_ACTIONS)
litellm_disagg_planner_signal                         gauge     model, signal             its last step's pressures and SLO ratios (NaN: unknown)
**process**
litellm_disagg_build_info                             gauge     version                   1, with the plugin's version
===================================================== ========= ========================= =================================================

Several proxy processes (``--num_workers``) with ``PROMETHEUS_MULTIPROC_DIR`` set: each gauge says how its processes
combine (``multiprocess_mode``): per-process counts add up (``livesum``), shared views take the latest (``livemostrecent``),
``discovery_up`` the worst (``livemin``). See docs/observability.md.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from litellm_disagg.version import __version__

# -- label values (bounded sets) ---------------------------------------------------------------------------------------

MODES: Final = ("disaggregated", "local_prefill", "aggregated")
"""disaggregated: remote prefill; local_prefill: the decode worker prefilled by choice; aggregated: a fallback."""
LOCAL_REASONS: Final = ("not_splittable", "cost_model", "threshold", "mode_never", "aggregated_worker", "other")
FAILOVER_CAUSES: Final = ("timeout", "connection", "overloaded", "server_error", "bad_response")
FALLBACK_CAUSES: Final = ("no_prefill_worker", "prefill_failed")
FAILURE_CAUSES: Final = ("worker", "other")
MIGRATION_CAUSES: Final = ("stream_error", "incomplete")
MIGRATION_OUTCOMES: Final = ("migrated", "failed", "limit", "no_worker", "unsupported")
PLANNER_ACTIONS: Final = ("scale_up", "scale_down", "role_change")
INDEX_KINDS: Final = ("held", "distinct", "predicted", "pending_release")

# -- buckets -----------------------------------------------------------------------------------------------------------

TTFT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5,
                       10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
ITL_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                      0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
                      180.0, 300.0, 600.0)
SELECTION_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
BACKLOG_TOKEN_BUCKETS: Final = (0, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)

_WORKER = ("model", "role", "worker")

# -- requests ----------------------------------------------------------------------------------------------------------

REQUESTS = Counter("litellm_disagg_requests_total", "Requests routed, by mode", ["model", "mode"])
TTFT = Histogram("litellm_disagg_time_to_first_token_seconds", "Streamed requests: from routing to the first chunk",
                 ["model", "mode"], buckets=TTFT_BUCKETS)
ITL = Histogram("litellm_disagg_inter_token_latency_seconds", "Streamed requests: time between consecutive chunks",
                ["model", "mode"], buckets=ITL_BUCKETS)
REQUEST_DURATION = Histogram("litellm_disagg_request_duration_seconds", "From routing to the request's end",
                             ["model", "mode"], buckets=E2E_BUCKETS)
REQUEST_FAILURES = Counter("litellm_disagg_request_failures_total", "Routed requests that failed",
                           ["model", "mode", "cause"])
ROUTE = Histogram("litellm_disagg_route_seconds", "From routing to the decode call: selection, prefill, failovers",
                  ["model", "mode"], buckets=TTFT_BUCKETS)
SELECTION = Histogram("litellm_disagg_selection_seconds", "Choosing the workers of one request", ["model"],
                      buckets=SELECTION_BUCKETS)
PREFILL_DURATION = Histogram("litellm_disagg_prefill_duration_seconds", "One successful remote prefill call",
                             ["model", "worker"], buckets=TTFT_BUCKETS)
MIGRATIONS = Counter("litellm_disagg_migrations_total", "Streams broken mid-answer and continued elsewhere",
                     ["cause", "outcome"])

# -- routing -----------------------------------------------------------------------------------------------------------

ROUTED = Counter("litellm_disagg_routed_total", "Workers chosen, by pool", _WORKER)
PROMPT_TOKENS = Counter("litellm_disagg_prompt_tokens_total", "Prompt tokens of requests sent to the worker", _WORKER)
ARRIVED_PROMPT_TOKENS = Counter("litellm_disagg_arrived_prompt_tokens_total",
                                "Prompt tokens of requests when their workers are chosen, before any prefill", ["model"])
CACHED_PROMPT_TOKENS = Counter("litellm_disagg_cached_prompt_tokens_total",
                               "Prompt tokens the worker held in its prefix cache", _WORKER)
LOCAL_PREFILLS = Counter("litellm_disagg_local_prefills_total", "Decode worker prefilled by choice",
                         ["model", "reason"])
PREFILL_FAILOVERS = Counter("litellm_disagg_prefill_failovers_total", "Prefill attempts that failed over",
                            ["model", "worker", "cause"])
DECODE_ABORTS = Counter("litellm_disagg_decode_aborts_total",
                        "Decode calls ended because their concurrent prefill failed", ["worker"])
AGGREGATED_FALLBACKS = Counter("litellm_disagg_aggregated_fallbacks_total",
                               "Requests served aggregated for lack of a prefill", ["model", "cause"])
COST_ESTIMATE = Histogram("litellm_disagg_prefill_cost_estimate_seconds",
                          "The remote-or-local decision's estimate, per request", ["model", "option"],
                          buckets=TTFT_BUCKETS)
BACKLOG_TOKENS = Histogram("litellm_disagg_prefill_backlog_tokens",
                           "Prompt tokens waiting to be prefilled ahead of the request, as the remote-or-local decision "
                           "priced them", ["model", "option"], buckets=BACKLOG_TOKEN_BUCKETS)
COST_RATE = Gauge("litellm_disagg_cost_model_tokens_per_second", "KV routing's fitted rate", ["phase"],
                  multiprocess_mode="livemostrecent")
COST_OVERHEAD = Gauge("litellm_disagg_cost_model_overhead_seconds", "KV routing's fitted fixed cost per call",
                      ["phase"], multiprocess_mode="livemostrecent")
COST_STALL_WEIGHT = Gauge("litellm_disagg_cost_model_decode_time_weight",
                          "KV routing's decode-stall weight in use (fitted from inter-token gaps, or the prior)",
                          ["source"], multiprocess_mode="livemostrecent")
COST_STALL_GAP = Gauge("litellm_disagg_cost_model_decode_gap_seconds",
                       "The stall fit's mean inter-token gap (during: a local prefill on the worker)", ["kind"],
                       multiprocess_mode="livemostrecent")
COST_STALL_GAPS = Gauge("litellm_disagg_cost_model_decode_gaps", "Inter-token gaps the stall fit has seen", ["kind"],
                        multiprocess_mode="livemostrecent")

# -- pools and workers -------------------------------------------------------------------------------------------------

WORKERS = Gauge("litellm_disagg_workers", "Workers discovery lists", ["model", "role", "state"],
                multiprocess_mode="livemostrecent")
WORKER_STATE = Gauge("litellm_disagg_worker_state", "1 for the worker's current state", [*_WORKER, "state"],
                     multiprocess_mode="livemostrecent")
WORKER_COOLING = Gauge("litellm_disagg_worker_cooling_down", "1 while the worker is in failure cooldown", _WORKER,
                       multiprocess_mode="livemax")
WORKER_INFLIGHT = Gauge("litellm_disagg_worker_inflight_requests", "Calls in flight on the worker", _WORKER,
                        multiprocess_mode="livesum")
WORKER_QUEUED_PREFILL = Gauge("litellm_disagg_worker_queued_prefill_tokens", "Prompt tokens sent, not yet prefilled",
                              _WORKER, multiprocess_mode="livesum")
WORKER_RUNNING = Gauge("litellm_disagg_worker_running_requests", "Engine's running batch (scraped)", _WORKER,
                       multiprocess_mode="livemostrecent")
WORKER_WAITING = Gauge("litellm_disagg_worker_waiting_requests", "Engine's queue (scraped)", _WORKER,
                       multiprocess_mode="livemostrecent")
WORKER_KV_USAGE = Gauge("litellm_disagg_worker_kv_usage_ratio", "Engine's KV cache in use, 0..1 (scraped)", _WORKER,
                        multiprocess_mode="livemostrecent")

# -- in flight on other proxy replicas (routing/shared_inflight.py) ----------------------------------------------------

SHARED_INFLIGHT_UP = Gauge("litellm_disagg_shared_inflight_up",
                           "1 while the in-flight exchange with the other replicas through Redis succeeds",
                           multiprocess_mode="livemin")
SHARED_INFLIGHT_REPLICAS = Gauge("litellm_disagg_shared_inflight_replicas",
                                 "Other proxy replicas heard in the last exchange", multiprocess_mode="livemax")
SHARED_INFLIGHT_REQUESTS = Gauge("litellm_disagg_shared_inflight_requests",
                                 "Calls the other proxy replicas have in flight, all workers", multiprocess_mode="livemax")

# -- KV transfers and index --------------------------------------------------------------------------------------------

KV_TRANSFERS = Counter("litellm_disagg_kv_transfers_total", "KV transfers completed (decode side)", ["model", "worker"])
KV_TRANSFER_SECONDS = Counter("litellm_disagg_kv_transfer_seconds_total", "KV transfer durations, added up",
                              ["model", "worker"])
KV_TRANSFER_TOKENS = Counter("litellm_disagg_kv_transfer_tokens_total", "Prompt tokens that arrived by transfer",
                             ["model", "worker"])
KV_TRANSFER_BYTES = Counter("litellm_disagg_kv_transfer_bytes_total", "KV bytes moved (decode side)",
                            ["model", "worker"])
KV_INDEX_BLOCKS = Gauge("litellm_disagg_kv_index_blocks", "Prefix index size", ["kind"],
                        multiprocess_mode="livemostrecent")
KV_INDEX_WORKERS = Gauge("litellm_disagg_kv_index_workers", "Workers in the prefix index",
                         multiprocess_mode="livemostrecent")
KV_EVENT_BATCHES = Counter("litellm_disagg_kv_event_batches_total", "KV event batches applied", ["worker"])
KV_EVENT_GAPS = Counter("litellm_disagg_kv_event_gaps_total", "KV event sequence gaps seen", ["worker"])
KV_EVENT_LAG = Gauge("litellm_disagg_kv_event_lag_seconds", "Engine timestamp to applied, last batch", ["worker"],
                     multiprocess_mode="livemax")
KV_EVENT_LAST_APPLIED = Gauge("litellm_disagg_kv_event_last_applied_timestamp_seconds",
                              "When the last KV event batch was applied", ["worker"], multiprocess_mode="livemax")

# -- discovery ---------------------------------------------------------------------------------------------------------

DISCOVERY_UP = Gauge(
    "litellm_disagg_discovery_up",
    "1 while the discovery backend answers, 0 while it does not (routing continues on the last known workers)",
    multiprocess_mode="livemin",
)
DISCOVERY_LAST_SUCCESS = Gauge("litellm_disagg_discovery_last_success_timestamp_seconds",
                               "Last successful read of discovery", multiprocess_mode="livemax")
DISCOVERY_LAST_CHANGE = Gauge("litellm_disagg_discovery_last_change_timestamp_seconds",
                              "Last time the worker list changed", multiprocess_mode="livemax")

# -- planner (set by the planner, issue 9) -----------------------------------------------------------------------------

PLANNER_ENABLED = Gauge("litellm_disagg_planner_enabled", "1 while a planner runs in this process",
                        multiprocess_mode="livemax")
PLANNER_LEADER = Gauge("litellm_disagg_planner_leader", "1 while this process's planner holds the planner lock",
                       multiprocess_mode="livemax")
PLANNER_DESIRED_WORKERS = Gauge("litellm_disagg_planner_desired_workers", "Pool size the planner wants",
                                ["model", "role"], multiprocess_mode="livemostrecent")
PLANNER_DECISIONS = Counter("litellm_disagg_planner_decisions_total", "Planner actions", ["model", "action"])
PLANNER_SIGNAL = Gauge("litellm_disagg_planner_signal", "The inputs of the planner's last decision",
                       ["model", "signal"], multiprocess_mode="livemostrecent")

# -- process -----------------------------------------------------------------------------------------------------------

BUILD_INFO = Gauge("litellm_disagg_build_info", "The plugin's version", ["version"], multiprocess_mode="livemax")
BUILD_INFO.labels(__version__).set(1)
