#!/usr/bin/env bash
# The main job on a fresh machine: create .venv, install lit-dof, and distil the embedded SmolLM2-135M into a
# sliding-window + linear student on English Wikipedia: exact attention over the last 64 tokens and 4 sinks, a
# learned linear far term with DoF-allocated dims (configs/quickstart.yaml; sized for < 60 min on 2 CPU cores).
# Data: streamed from the Hugging Face hub by default; offline, point LIT_DOF_CORPUS at a local corpus
# (plain text, .txt.gz, jsonl or WikiExtractor), e.g. LIT_DOF_CORPUS=../shared/data/wikipedia/enwiki_wikiextractor_AA.txt.gz
# Extra arguments go to `lit-dof fit` (e.g. --trainer.max_steps 200, --data.init_args.path FILE).
# Outputs: runs/quickstart/version_N/ (TensorBoard logs, dof.json, config.yaml, student/, checkpoints/); resume a
# killed run in place with: scripts/quickstart.sh --ckpt_path last
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_venv.sh
exec .venv/bin/lit-dof fit --config configs/quickstart.yaml "$@"
