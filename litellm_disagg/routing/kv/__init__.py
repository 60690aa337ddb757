"""KV-aware routing: score prefill and decode workers on prefix-cache overlap and load; decide P/D per request.

Reading order and a configuration example: ``README.md`` in this package. Public API below.
"""

from litellm_disagg.routing.kv.block_hash import ROOT, BlockHash, PromptBlocks, chain_hashes, root_hash
from litellm_disagg.routing.kv.disagg_decision import (
    DisaggDecider,
    DisaggDecision,
    DisaggInputs,
    LinearEstimate,
    OnlineLinearFit,
)
from litellm_disagg.routing.kv.event_applier import ApplierStats, EventApplier
from litellm_disagg.routing.kv.event_subscriber import BadEndpoint, KVEventSubscriber
from litellm_disagg.routing.kv.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    MalformedBatch,
    decode_message,
    decode_payload,
)
from litellm_disagg.routing.kv.load_scraper import LoadScraper, ScrapedLoad, parse_metrics
from litellm_disagg.routing.kv.prefix_index import IndexStats, PrefixIndex
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.scorers import (
    CostTerms,
    KVCostScorer,
    KVFreeScorer,
    LoadScorer,
    PrefixOverlapScorer,
    Scorer,
    ScoringContext,
    kv_cost,
    make_scorer,
    usable_cached_tokens,
)
from litellm_disagg.routing.kv.selection import Selection, Selector, WorkerBreakdown
from litellm_disagg.routing.kv.settings import (
    CostWeights,
    DisaggDecisionSettings,
    EventSettings,
    IndexSettings,
    KVRoutingSettings,
    LoadSettings,
    ProfileSettings,
    TokenizerSettings,
)
from litellm_disagg.routing.kv.tokenizer import PromptTokenizer, tokenize_body
from litellm_disagg.routing.kv.worker_load import TokenLoadTracker, WorkerLoad, collect_loads

__all__ = [
    "ROOT",
    "AllBlocksCleared",
    "ApplierStats",
    "BadEndpoint",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "CostTerms",
    "CostWeights",
    "DisaggDecider",
    "DisaggDecision",
    "DisaggDecisionSettings",
    "DisaggInputs",
    "EventApplier",
    "EventBatch",
    "EventSettings",
    "IndexSettings",
    "IndexStats",
    "KVCostScorer",
    "KVEventSubscriber",
    "KVFreeScorer",
    "KVRouter",
    "KVRoutingSettings",
    "LinearEstimate",
    "LoadScorer",
    "LoadScraper",
    "LoadSettings",
    "MalformedBatch",
    "OnlineLinearFit",
    "PrefixIndex",
    "PrefixOverlapScorer",
    "ProfileSettings",
    "PromptBlocks",
    "PromptTokenizer",
    "Scorer",
    "ScoringContext",
    "ScrapedLoad",
    "Selection",
    "Selector",
    "TokenLoadTracker",
    "TokenizerSettings",
    "WorkerBreakdown",
    "WorkerLoad",
    "chain_hashes",
    "collect_loads",
    "decode_message",
    "decode_payload",
    "kv_cost",
    "make_scorer",
    "parse_metrics",
    "root_hash",
    "tokenize_body",
    "usable_cached_tokens",
]
