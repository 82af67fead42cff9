#!/usr/bin/env bash
# The main job on a fresh machine: create .venv, install lit-dof, and distil the embedded SmolLM2-135M into a
# sliding-window + linear student on English Wikipedia: exact attention over the last 64 tokens and 4 sinks, a
# learned linear far term with DoF-allocated dims, 18 retrieval heads kept exact (configs/quickstart.yaml; sized
# for < 60 min on 2 CPU cores).
# --smoke (first argument): the one-minute start instead, the same path at a toy budget (configs/smoke.yaml over
# the quickstart: 16 steps of 2 x 128 tokens; about a minute on 2 CPU cores once .venv is installed).
# Data: streamed from the Hugging Face hub by default; offline, point LIT_DOF_CORPUS at a local corpus
# (plain text, .txt.gz, jsonl or WikiExtractor), e.g. LIT_DOF_CORPUS=../shared/data/wikipedia/enwiki_wikiextractor_AA.txt.gz
# Extra arguments go to `lit-dof fit` (e.g. --trainer.max_steps 200, --data.init_args.path FILE).
# Outputs: runs/quickstart/version_N/ (runs/smoke/version_N/ with --smoke): TensorBoard logs, dof.json, figures/,
# config.yaml, checkpoints/ and the student/; at the end the script prints the run directory, the student and the
# commands to try it. Resume a killed run in place with: scripts/quickstart.sh --ckpt_path last
# LIT_DOF_SKIP_SETUP=1: use .venv as it is (no pip install; e.g. offline, or a second run).
set -euo pipefail
cd "$(dirname "$0")/.."
name=quickstart
configs=(--config configs/quickstart.yaml)
if [[ "${1:-}" == "--smoke" ]]; then
  shift
  name=smoke
  configs+=(--config configs/smoke.yaml)
  # One thread unless told otherwise: at this toy size a second one gains little, and on a busy machine its
  # OpenMP spin-waits cost most (a shared 2-core CPU, quiet: 56 s with one thread, 43 s with two; busy: 89 s, 585 s).
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
if [[ "${LIT_DOF_SKIP_SETUP:-0}" != 1 ]]; then
  source scripts/setup_venv.sh eval  # eval: for the `lit-dof eval` printed at the end
fi
started=$SECONDS
.venv/bin/lit-dof fit "${configs[@]}" "$@"

run=$(ls -td "runs/$name"/version_*/ 2>/dev/null | head -n 1)
run=${run%/}
if [[ -z "$run" || ! -f "$run/student/config.json" ]]; then
  echo "quickstart: no student under runs/$name/version_*/ (a --trainer.logger option moved the run elsewhere?)" >&2
  exit 0
fi
student="$run/student"
cat <<EOF

Done in $((SECONDS - started)) s.
  run directory: $run   (TensorBoard logs, dof.json, figures/, config.yaml, checkpoints/)
  student:       $student   (load it with lit_dof.load_student or, after \`import lit_dof\`, transformers)
Next:
  .venv/bin/lit-dof generate --model $student --prompt "Once upon a time" --max_new_tokens 32
  .venv/bin/lit-dof chat $student --max-new-tokens 64         # one message per line; /exit ends
  .venv/bin/lit-dof eval --model $student --tasks '[arc_easy]' --limit 100 --builtin true   # offline: --data_dir DIR
  .venv/bin/tensorboard --logdir runs/$name
EOF
