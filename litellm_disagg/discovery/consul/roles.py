"""Role requests on Consul (``discovery/roles.py``): one KV key per worker, ``<role_kv_prefix>/<worker_id>``.

``write`` PUTs the request's JSON; ``follow`` reads the key with blocking queries (``watch.BlockingIndex``, the same
rules as the service loops) and yields the request at once and after every change; a missing key (404) is ``None``,
an invalid value is ``None`` and logged once. An unreachable Consul is retried with backoff, never raised: the
worker keeps its role meanwhile. ``delete`` removes the key (the worker's withdraw).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

from litellm_disagg.discovery.consul.http import ConsulError, ConsulHttp
from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.discovery.consul.watch import Backoff, BlockingIndex
from litellm_disagg.discovery.registry import RegistryError
from litellm_disagg.discovery.roles import RoleRequest, decode_request

logger = logging.getLogger(__name__)


def role_key(settings: ConsulRegistrySettings, worker_id: str) -> str:
    return f"{settings.role_kv_prefix.strip('/')}/{worker_id}"


async def write(http: ConsulHttp, settings: ConsulRegistrySettings, request: RoleRequest) -> None:
    key = role_key(settings, request.worker_id)
    response = await http.request("PUT", f"/v1/kv/{quote(key, safe='/')}", content=request.encode())
    if response.body is not True:
        raise RegistryError(f"consul refused to write KV {key!r}: {response.body!r}")


async def delete(http: ConsulHttp, settings: ConsulRegistrySettings, worker_id: str) -> None:
    await http.request("DELETE", f"/v1/kv/{quote(role_key(settings, worker_id), safe='/')}")


async def follow(
    http: ConsulHttp, settings: ConsulRegistrySettings, worker_id: str, closed: Callable[[], bool]
) -> AsyncIterator[RoleRequest | None]:
    key = role_key(settings, worker_id)
    index = BlockingIndex(settings.wait_s, settings.min_query_interval_s)
    backoff = Backoff(settings.retry_min_s, settings.retry_max_s)
    blocking_timeout_s = settings.wait_s * (1 + 1 / 16) + settings.request_timeout_s
    first, last, warned = True, None, ""
    while not closed():
        await index.pace()
        params = index.params()
        try:
            response = await http.request(
                "GET", f"/v1/kv/{quote(key, safe='/')}", params=params, accept=(200, 404),
                timeout_s=blocking_timeout_s if "index" in params else None,
            )
        except ConsulError as exc:
            if closed():
                return
            logger.warning("role requests of %s: %s (retrying)", worker_id, exc)
            await backoff.sleep()
            continue
        backoff.reset()
        index.advance(response.index)
        current: RoleRequest | None = None
        if response.status == 200:
            try:
                current = decode_request(_value(response.body), worker_id)
            except ValueError as exc:
                problem = " ".join(str(exc).split())[:300]
                if problem != warned:
                    warned = problem
                    logger.warning("consul KV %s: invalid role request skipped: %s", key, problem)
        if first or current != last:
            first, last = False, current
            yield current


def _value(body: Any) -> bytes:
    """The raw value of a single-key KV read (``[{"Value": <base64>}]``)."""
    if not isinstance(body, list) or len(body) != 1 or not isinstance(body[0], dict):
        raise ValueError("not a single KV entry")
    value = body[0].get("Value")
    if value is None:
        return b""
    if not isinstance(value, str):
        raise ValueError("KV Value is not a string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"KV Value is not base64: {exc}") from exc
