"""Put on PYTHONPATH of a vLLM worker by the litellm-disagg wrapper (never imported by the proxy).

NIXL's progress thread busy-spins a whole core per idle engine (its delay is 0). On CPU-only hosts, where the cores
are the engine's compute, the wrapper turns it off (``LITELLM_DISAGG_NIXL_PROGRESS_THREAD=0``); transfers still
complete because vLLM polls transfer status itself. The patch is applied lazily, when NIXL's ``_api`` module is
first imported, so importing this file costs nothing and leaves NIXL's import-time environment handling alone.
"""

import importlib.abc
import importlib.util
import os
import sys

_TARGETS = {"nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api"}


def _patch(module):
    config_cls = getattr(module, "nixl_agent_config", None)
    if config_cls is None or getattr(config_cls, "_litellm_disagg_patched", False):
        return
    original_init = config_cls.__init__

    def __init__(self, *args, **kwargs):
        kwargs["enable_prog_thread"] = False
        original_init(self, *args, **kwargs)

    config_cls.__init__ = __init__
    config_cls._litellm_disagg_patched = True


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


if os.environ.get("LITELLM_DISAGG_NIXL_PROGRESS_THREAD", "1") == "0":
    sys.meta_path.insert(0, _Finder())
