#!/usr/bin/env bash
# Create .venv (if missing), install lit-dof with every extra (setup_venv.sh's train, plots and gguf; test, eval and
# gpu), and run the test suite.
# Usage: scripts/test.sh [pytest args...]
# Env: PYTHON (interpreter), TORCH_VERSION (default 2.13.0), TEST_WORKERS (pytest-xdist workers, default: one per
# core; 0 runs in this process). A file's tests stay on one worker (--dist loadfile: module fixtures run once).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_venv.sh test,eval,gpu
# Tests never touch the network: hub ids must come from local files.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q --durations=20 -n "${TEST_WORKERS:-auto}" --dist loadfile "$@"
