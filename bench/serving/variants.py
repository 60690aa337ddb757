"""How many LiteLLM proxy replicas a benchmark arm runs through, and whether they share a Redis
(``--proxies 1,2,2r`` in ``bench.serving.replicas`` and ``bench.serving.pd``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Variant:
    """How many replicas, and whether they share a Redis (LiteLLM's ``router_settings.redis_host``/``redis_port``:
    LiteLLM's own state such as ``least-busy``'s counts, and litellm-disagg's in-flight exchange)."""

    proxies: int
    redis: bool = False

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``2`` or ``2r`` (with Redis)."""
        redis = text.endswith("r")
        count = int(text[:-1] if redis else text)
        if count < 1:
            raise ValueError(text)
        return cls(count, redis)

    @property
    def label(self) -> str:
        return f"x{self.proxies}" + ("+redis" if self.redis else "")


ONE = Variant(1)
"""One proxy, no Redis: every benchmark's default."""
