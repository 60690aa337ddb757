"""The in-process directory where simulated engines find each other's KV, keyed by engine id.

It stands in for NIXL: a decode engine looks up the ``remote_engine_id`` of its ``kv_transfer_params`` here, reads
the held blocks' lease, "transfers" (waits per the timing model) and releases them. An engine that crashed or
stopped is gone from the directory, so pulls from it fail, as they would against a dead peer. Engines in different
processes cannot see each other: their decodes fall back to recomputing the prompt.
"""

from __future__ import annotations

from typing import Protocol

from litellm_disagg.sim.request import Lease


class KVSource(Protocol):
    """What a decode engine may ask of a prefill engine."""

    @property
    def engine_id(self) -> str: ...

    def kv_lease(self, request_id: str) -> Lease | None: ...

    def release_kv_lease(self, request_id: str) -> None: ...

    def kv_lease_for_client_id(self, client_id: str) -> str | None: ...


class EngineDirectory:
    def __init__(self) -> None:
        self._engines: dict[str, KVSource] = {}

    def register(self, source: KVSource) -> None:
        if source.engine_id in self._engines and self._engines[source.engine_id] is not source:
            raise ValueError(f"engine id {source.engine_id!r} is already registered")
        self._engines[source.engine_id] = source

    def unregister(self, engine_id: str) -> None:
        self._engines.pop(engine_id, None)

    def get(self, engine_id: str) -> KVSource | None:
        return self._engines.get(engine_id)

    def __len__(self) -> int:
        return len(self._engines)


DIRECTORY = EngineDirectory()
"""The process-wide directory every engine uses unless given another."""
