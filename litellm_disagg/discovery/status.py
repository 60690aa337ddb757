"""Is discovery reachable? Gauges for Prometheus (``observability.metrics``: up, last successful read), and one log
line per transition (never one per retry).

While the backend is down, routers keep routing on the last snapshot they had: a registry's ``watch()`` simply
yields nothing new until it answers again.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import Gauge

from litellm_disagg.observability.metrics import DISCOVERY_LAST_SUCCESS, DISCOVERY_UP

logger = logging.getLogger(__name__)


class DiscoveryStatus:
    """Up or down, as seen by one registry's reads. ``up`` is ``None`` before the first answer."""

    def __init__(self, backend: str, gauge: Gauge = DISCOVERY_UP):
        self.backend = backend
        self.gauge = gauge
        self.up: bool | None = None

    def ok(self) -> None:
        DISCOVERY_LAST_SUCCESS.set(time.time())
        if self.up is False:
            logger.warning("%s reachable again, discovery resumed", self.backend)
        if self.up is not True:
            self.up = True
            self.gauge.set(1)

    def failed(self, reason: BaseException | str) -> None:
        if self.up is not False:
            logger.warning("%s unreachable, routing on last known workers (%s)", self.backend, reason)
            self.up = False
            self.gauge.set(0)
