"""Follow one worker's entry in discovery until a condition holds or a timeout passes: what the operator commands
(``litellm-disagg role``, ``litellm-disagg drain``) wait on after writing their request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from litellm_disagg.discovery.registry import Registry
from litellm_disagg.runtime_config import RuntimeConfig


def find_worker(configs: list[RuntimeConfig], worker_id: str) -> RuntimeConfig | None:
    """The entry for ``worker_id`` in a snapshot, if listed."""
    return next((c for c in configs if c.worker_id == worker_id), None)


@dataclass(frozen=True)
class WatchOutcome:
    reached: bool
    """Whether ``until`` held for the worker's entry, in the watch or in the snapshot read after its timeout."""
    entry: RuntimeConfig | None
    """The worker's last entry seen (None: not listed)."""


async def watch_worker(
    registry: Registry,
    worker_id: str,
    *,
    until: Callable[[RuntimeConfig | None], bool],
    timeout_s: float,
    on_entry: Callable[[RuntimeConfig | None], None] | None = None,
) -> WatchOutcome:
    """Watch discovery until ``until(entry)`` holds for ``worker_id``'s entry (None when it is not listed), or
    ``timeout_s`` passes. ``on_entry`` sees every entry the watch yields (progress lines). After a timeout one more
    snapshot is read, so a change that landed between the watch's last yield and the timeout still counts.
    ``RegistryError`` from discovery propagates."""
    try:
        async with asyncio.timeout(timeout_s):
            async for configs in registry.watch():
                entry = find_worker(configs, worker_id)
                if on_entry is not None:
                    on_entry(entry)
                if until(entry):
                    return WatchOutcome(reached=True, entry=entry)
    except TimeoutError:
        pass
    entry = find_worker(await registry.snapshot(), worker_id)
    return WatchOutcome(reached=until(entry), entry=entry)
