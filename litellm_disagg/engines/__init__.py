"""Engines: everything litellm-disagg knows about a particular inference engine sits behind this package.

``base`` is the contract (read it first): the ``TransferProtocol`` the router runs a disaggregated request with, the
``EngineAdapter`` workers and observers use, and the engine-neutral types they exchange. One folder per engine
implements it (``vllm/``, ``sglang/``, ``trtllm/``; ``README.md`` says what a new one must provide). ``prom_text`` reads any engine's
Prometheus ``/metrics`` page.

Lookups: ``get_engine(name)``, ``engine_for(worker)`` (by ``RuntimeConfig.engine``), ``transfer_for(worker)`` (the
protocol its ``transfer.kind`` names: vLLM speaks pull and push), ``client_transfer_keys()`` (what
the router strips from client requests, over all engines). ``ENGINES`` is the read-only table behind them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from litellm_disagg.engines.base import Engine, TransferProtocol
from litellm_disagg.engines.sglang import SGLANG
from litellm_disagg.engines.trtllm import TRTLLM
from litellm_disagg.engines.vllm import VLLM
from litellm_disagg.runtime_config import RuntimeConfig

ENGINES: Final[Mapping[str, Engine]] = MappingProxyType({engine.name: engine for engine in (VLLM, SGLANG, TRTLLM)})
"""Every engine by name (``RuntimeConfig.engine``). Read-only."""

_CLIENT_KEYS: Final = frozenset(
    key
    for engine in ENGINES.values()
    for protocol in (engine.transfer, *engine.other_transfers)
    for key in protocol.client_keys
)


class UnknownEngine(LookupError):
    """No engine of that name in this version."""


def get_engine(name: str) -> Engine:
    """The engine called ``name``. Raises ``UnknownEngine``."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownEngine(f"unknown engine {name!r} (known: {', '.join(sorted(ENGINES))})") from None


def engine_for(worker: RuntimeConfig) -> Engine:
    """The engine a worker runs (its config names it; validation already checked the name and transfer kind)."""
    return get_engine(worker.engine)


def transfer_for(worker: RuntimeConfig) -> TransferProtocol:
    """The transfer protocol a worker speaks: its engine's protocol named by its ``transfer.kind`` (vLLM: pull or
    push). Validation already checked that the engine has it."""
    return get_engine(worker.engine).transfer_for(worker.transfer.kind)


def client_transfer_keys() -> frozenset[str]:
    """Request keys only the router may set, over every engine's transfer protocol: stripped from client requests."""
    return _CLIENT_KEYS


__all__ = ["ENGINES", "UnknownEngine", "client_transfer_keys", "engine_for", "get_engine", "transfer_for"]
