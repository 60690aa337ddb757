"""The key the proxy presents to its workers (vLLM's ``--api-key``): where it comes from, and how it is sent.

Workers started by ``litellm-disagg worker --api-key-file FILE`` (or with ``LITELLM_DISAGG_WORKER_API_KEY`` set)
refuse any ``/v1`` request without ``Authorization: Bearer <key>``, and publish ``api_key_required: true`` in
discovery, never the key. The proxy learns the key from its own side, the ``worker_auth:`` section:

- ``api_key_file``: a file holding the key (a mounted secret), read once at start; else
- the environment variable named by ``api_key_env`` (default ``LITELLM_DISAGG_WORKER_API_KEY``).

One key for every worker this proxy routes to. Sent by the prefill client, the load scraper, the ``/tokenize``
fallback and LiteLLM's decode call (the deployment's ``api_key``). A worker that requires a key while the proxy has
none is not admitted (logged). The key is never logged: ``WorkerKey``'s repr hides it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)

DEFAULT_ENV = "LITELLM_DISAGG_WORKER_API_KEY"
MAX_KEY_BYTES = 4096


class WorkerAuthSettings(BaseModel):
    """The ``worker_auth:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_key_file: str | None = None
    """A file whose content (stripped) is the workers' key. Takes precedence over ``api_key_env``."""
    api_key_env: Annotated[str, Field(min_length=1)] = DEFAULT_ENV
    """The environment variable holding the workers' key when no file is given."""


@dataclass(frozen=True)
class WorkerKey:
    """The workers' key, or none. ``headers()`` is what every request to a worker carries."""

    value: str | None = field(default=None, repr=False)

    def __bool__(self) -> bool:
        return bool(self.value)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.value}"} if self.value else {}

    def __repr__(self) -> str:
        return f"WorkerKey({'set' if self.value else 'none'})"


def read_key_file(path: str | os.PathLike[str]) -> str:
    """The key in ``path`` (surrounding whitespace removed). Raises ``ValueError`` for an empty or oversized file."""
    data = Path(path).read_bytes()
    if len(data) > MAX_KEY_BYTES:
        raise ValueError(f"{path}: a key file over {MAX_KEY_BYTES} bytes")
    key = data.decode("utf-8").strip()
    if not key:
        raise ValueError(f"{path}: the key file is empty")
    return key


def load_worker_key(settings: WorkerAuthSettings) -> WorkerKey:
    """The key this proxy sends its workers (``worker_auth``), or an empty ``WorkerKey``."""
    if settings.api_key_file is not None:
        return WorkerKey(read_key_file(settings.api_key_file))
    return WorkerKey(os.environ.get(settings.api_key_env) or None)
