#!/usr/bin/env bash
# Build the compiled core of KV routing (litellm_disagg/routing/kv/_kvcore.pyx, _kvwire.pyx) in place, with Cython from PyPI and
# the machine's C compiler. Optional: without it (no compiler, no Python headers) the package runs its pure-Python
# twins (litellm_disagg/routing/kv/native.py) with the same results. Called by scripts/setup.sh; idempotent.
#   VENV=path   the virtual environment (default: .venv in the project)
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
if ! "$PY" -m pip --disable-pip-version-check install -q 'cython>=3.0,<4'; then
  echo "build_native: cannot install Cython; KV routing runs in pure Python" >&2; exit 0
fi
# -O3: the kernels are tight integer loops; no -march=native (the build may be copied to another machine).
if ! CFLAGS="-O3" "$PY" -m Cython.Build.Cythonize -i -q \
    litellm_disagg/routing/kv/_kvcore.pyx litellm_disagg/routing/kv/_kvwire.pyx; then
  echo "build_native: compiling litellm_disagg/routing/kv/_kvcore.pyx or _kvwire.pyx failed; KV routing runs in pure Python" >&2
  exit 0
fi
"$PY" -c "from litellm_disagg.routing.kv import native; assert native.NATIVE and native.wire, native.WHY" \
  && echo "build_native: compiled KV routing core in use" \
  || echo "build_native: the compiled core does not load; KV routing runs in pure Python" >&2
