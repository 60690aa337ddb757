"""Command-line flags that choose and configure a registry backend (shared by the ``worker`` and ``workers`` commands)."""

from __future__ import annotations

import argparse

from litellm_disagg.settings import FileRegistrySettings, RegistrySettings, default_registry_dir
from litellm_disagg.workers.registry import Registry
from litellm_disagg.workers.registry_factory import make_registry


def add_registry_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("discovery")
    group.add_argument("--registry", choices=["file"], default="file", help="registry backend (default: file)")
    group.add_argument(
        "--registry-dir",
        default=None,
        help="file registry directory (default: $LITELLM_DISAGG_REGISTRY_DIR or ~/.cache/litellm-disagg/registry)",
    )


def registry_settings_from_args(args: argparse.Namespace) -> RegistrySettings:
    return FileRegistrySettings(path=args.registry_dir or default_registry_dir())


def registry_from_args(args: argparse.Namespace) -> Registry:
    return make_registry(registry_settings_from_args(args))
