"""Concurrent-orchestration test scaffolding: prefill workers behind an httpx ``MockTransport`` that hold every
prefill at a gate, and an ``Orchestrator`` over them (``tests/routing/test_concurrent_orchestrator.py`` for SGLang's
bootstrap rooms, ``test_push_orchestrator.py`` for vLLM's push connector).

A subclass says what its engine answers: ``abort_path`` and ``abort_response`` (the decode worker's abort endpoint),
``answer(host)`` (a successful prefill's JSON). ``status`` is one status for every host or a status per host;
``"refused"`` stands for a refused connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import httpx

from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.orchestrator import Orchestrator
from litellm_disagg.transfer.prefill import PrefillClient

Status = int | str


class GatedWorkers:
    abort_path: str

    def __init__(self, status: Status | Mapping[str, Status]):
        self.status = status
        self.gate = asyncio.Event()
        self.calls: list[tuple[str, str, dict]] = []

    def abort_response(self) -> httpx.Response:
        return httpx.Response(200)

    def answer(self, host: str) -> dict[str, Any]:
        raise NotImplementedError

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        host = request.url.host
        self.calls.append((host, request.url.path, body))
        if request.url.path == self.abort_path:
            return self.abort_response()
        await self.gate.wait()
        what = self.status[host] if isinstance(self.status, Mapping) else self.status
        if what == "refused":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(int(what), json=self.answer(host))


def orchestrator(workers: GatedWorkers, **kwargs: Any) -> tuple[Orchestrator, Accounting, FailureCooldown]:
    client = PrefillClient(client=httpx.AsyncClient(transport=httpx.MockTransport(workers.handle)))
    accounting, cooldown = Accounting(), FailureCooldown()
    orch = Orchestrator(prefill_client=client, accounting=accounting, cooldown=cooldown,
                        abort_window_s=kwargs.pop("abort_window_s", 0.0), abort_interval_s=0.01, **kwargs)
    return orch, accounting, cooldown


async def settle(orch: Orchestrator) -> None:
    """Until the orchestrator's background prefills (and the aborts they send) have finished."""
    while orch._background:
        await asyncio.gather(*list(orch._background))
