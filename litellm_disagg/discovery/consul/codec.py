"""RuntimeConfig <-> Consul service registration: Meta (or KV), tags, names, durations. Pure: no I/O.

Service Meta is a map of strings with hard limits (checked by Consul, which answers 400 otherwise): at most 64 pairs;
keys of at most 128 characters from ``[A-Za-z0-9_-]`` not starting with ``consul-``; values of at most 512 bytes
(Consul measures bytes, so multi-byte UTF-8 text reaches the limit before 512 characters).

A config that fits is written field by field, each RuntimeConfig field under its own name (``model``, ``role``,
``kv_capacity_blocks``...), numbers as their JSON text, plus ``ld_format: meta-1``. The transfer section is flattened,
one key per field under the reserved ``transfer_`` prefix (``transfer_kind``, ``transfer_host``, ``transfer_port``),
so a normal worker still fits Meta. The 0.1 keys a serialized config carries (``backend``, ``nixl_host``,
``nixl_port``) are written too, for 0.1 routers; entries of the 0.1 codec (those keys, no ``transfer_``) read back as
before. Reading is the one place where numbers come from strings, since Meta has nothing else (validation is
RuntimeConfig's, in lax mode).

A config that does not fit (a long multi-byte model name; any non-scalar field a newer RuntimeConfig may add) goes to
KV as one JSON document under ``<kv_prefix>/<worker_id>/<sha256 prefix>``; Meta then holds ``ld_format: kv-1``,
``ld_kv_key`` and the short identifying fields that fit, for people reading the Consul UI. The key is content-addressed,
so a reader never pairs a registration with a half-updated document, and a document can be cached by key. Nothing is
ever truncated: a config that fits neither (KV's 512 KiB) is refused with ``ConfigTooLarge``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from litellm_disagg.runtime_config import LEGACY_KEYS, RuntimeConfig

META_MAX_PAIRS = 64
META_MAX_KEY_CHARS = 128
META_MAX_VALUE_BYTES = 512
META_RESERVED_PREFIX = "consul-"
KV_MAX_VALUE_BYTES = 512 * 1024
_META_KEY = re.compile(r"^[A-Za-z0-9_-]+$")

FORMAT_KEY = "ld_format"
KV_KEY = "ld_kv_key"
FORMAT_META = "meta-1"
FORMAT_KV = "kv-1"
_SUMMARY_FIELDS = ("worker_id", "model", "role", "state")
ROLES_KEY = "allowed_roles"
"""The one list field of a config: its roles, comma-separated in Meta."""
TRANSFER_PREFIX = "transfer_"
"""Meta keys of the flattened transfer section (``transfer_kind``, ``transfer_host``...)."""
_SERVICE_NAME_MAX = 63  # one DNS label: Consul warns about longer (or non-DNS) service names


class ConfigTooLarge(ValueError):
    """The config fits neither service Meta nor one KV value."""


class UndecodableEntry(ValueError):
    """A registration that is not one of ours in a form this version reads (validation errors are separate)."""


def meta_problem(meta: Mapping[str, str]) -> str | None:
    """Why Consul would refuse this Meta (400), or ``None`` when it is acceptable."""
    if len(meta) > META_MAX_PAIRS:
        return f"more than {META_MAX_PAIRS} Meta pairs ({len(meta)})"
    for key, value in meta.items():
        if not key:
            return "an empty Meta key"
        if len(key) > META_MAX_KEY_CHARS:
            return f"Meta key {key[:40]!r}... longer than {META_MAX_KEY_CHARS} characters"
        if not _META_KEY.match(key):
            return f"Meta key {key!r} has characters outside [A-Za-z0-9_-]"
        if key.startswith(META_RESERVED_PREFIX):
            return f"Meta key {key!r} uses the reserved prefix {META_RESERVED_PREFIX!r}"
        if len(value.encode()) > META_MAX_VALUE_BYTES:
            return f"Meta value of {key!r} longer than {META_MAX_VALUE_BYTES} bytes"
    return None


@dataclass(frozen=True)
class KvDocument:
    key: str
    value: bytes


@dataclass(frozen=True)
class Encoded:
    """What to write for one config: the service Meta, and the KV document it points to (when it did not fit)."""

    meta: dict[str, str]
    kv: KvDocument | None = None


def encode(config: RuntimeConfig, *, kv_prefix: str) -> Encoded:
    meta = _as_meta(config)
    if meta is not None and meta_problem(meta) is None:
        return Encoded(meta=meta)
    document = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()
    if len(document) > KV_MAX_VALUE_BYTES:
        raise ConfigTooLarge(
            f"config of {config.worker_id!r} is {len(document)} bytes; one Consul KV value holds {KV_MAX_VALUE_BYTES}"
        )
    key = kv_key(kv_prefix, config.worker_id, document)
    summary = {FORMAT_KEY: FORMAT_KV, KV_KEY: key}
    for name in _SUMMARY_FIELDS:
        value = _scalar_text(config.model_dump(mode="json")[name])
        if value is not None and len(value.encode()) <= META_MAX_VALUE_BYTES:
            summary[name] = value
    return Encoded(meta=summary, kv=KvDocument(key=key, value=document))


def kv_key(kv_prefix: str, worker_id: str, document: bytes) -> str:
    return f"{worker_id_prefix(kv_prefix, worker_id)}{hashlib.sha256(document).hexdigest()[:16]}"


def worker_id_prefix(kv_prefix: str, worker_id: str) -> str:
    """The KV folder of one worker, with its trailing slash (so ``w1`` never matches ``w10``)."""
    return f"{kv_prefix.strip('/')}/{worker_id}/"


def _as_meta(config: RuntimeConfig) -> dict[str, str] | None:
    """The config as Meta strings, or ``None`` when a field has no string form (a list; ``None`` over a default)."""
    meta: dict[str, str] = {}
    fields = config.model_dump(mode="json")
    transfer = fields.pop("transfer")
    if ROLES_KEY in fields:  # a list of role names: one comma-separated Meta value
        fields[ROLES_KEY] = ",".join(fields[ROLES_KEY])
    for name, value in [*fields.items(), *((f"{TRANSFER_PREFIX}{key}", value) for key, value in transfer.items())]:
        if value is None:
            field = RuntimeConfig.model_fields.get(name)
            if field is None or field.get_default(call_default_factory=False) is not None:
                return None
            continue  # absent == the default None
        text = _scalar_text(value)
        if text is None:
            return None
        meta[name] = text
    meta[FORMAT_KEY] = FORMAT_META
    return meta


def _scalar_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)  # float repr round-trips exactly
    return None


@dataclass(frozen=True)
class KvReference:
    key: str


def decode_meta(meta: Mapping[str, str]) -> RuntimeConfig | KvReference:
    """A registration's Meta -> its config, or where in KV the config is. Raises ValueError (incl. ValidationError)."""
    form = meta.get(FORMAT_KEY)
    if form == FORMAT_KV:
        key = meta.get(KV_KEY)
        if not key:
            raise UndecodableEntry(f"{FORMAT_KEY}={FORMAT_KV} without {KV_KEY}")
        return KvReference(key)
    if form != FORMAT_META:
        raise UndecodableEntry(f"unknown {FORMAT_KEY} {form!r}")
    fields: dict[str, Any] = {
        name: value for name, value in meta.items() if name in RuntimeConfig.model_fields or name in LEGACY_KEYS
    }
    transfer = {name[len(TRANSFER_PREFIX) :]: value for name, value in meta.items() if name.startswith(TRANSFER_PREFIX)}
    if ROLES_KEY in fields:
        fields[ROLES_KEY] = [role for role in fields[ROLES_KEY].split(",") if role]
    if transfer:
        fields["transfer"] = transfer  # else a 0.1 entry: RuntimeConfig reads its nixl_host/nixl_port
    # Meta holds only strings: numbers and enums are parsed from their text here (lax), never anywhere else.
    return RuntimeConfig.model_validate(fields, strict=False)


def decode_kv(key: str, document: bytes) -> RuntimeConfig:
    """A KV document -> its config (strict JSON validation). The key's digest must match the content."""
    if not key.endswith(hashlib.sha256(document).hexdigest()[:16]):
        raise UndecodableEntry(f"KV document {key!r} does not match its digest")
    return RuntimeConfig.model_validate_json(document)


# -- names, tags, addresses, durations -------------------------------------------------------------------------------


def service_name_for(model: str, prefix: str) -> str:
    """A DNS-friendly service name for a model: ``litellm-disagg-`` + the model lowercased, other runs -> ``-``."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "model"
    name = f"{prefix}{slug}"
    if len(name) > _SERVICE_NAME_MAX:
        digest = hashlib.sha256(model.encode()).hexdigest()[:8]
        name = f"{name[: _SERVICE_NAME_MAX - 9].rstrip('-')}-{digest}"
    return name


def service_tags(config: RuntimeConfig, marker: str) -> list[str]:
    """The marker (what routers look for), the role and the state: ``?tag=prefill`` and DNS filters work on them."""
    return [marker, config.role.value, config.state.value]


def address_and_port(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def go_duration(seconds: float) -> str:
    """Seconds as a Go duration string (``10s``, ``250ms``), the form Consul parses."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"
