#!/bin/bash
# Issue #41, item 3: the paper's per-task protocol (METHOD.md §4) for the teacher and the pure linear Fix and DoF
# students at C = 64 (compare rows `fix`, `dof`: configs/base.yaml + methods/{fix,dof}.yaml, seed 0), on ARC-Easy
# and PIQA. Design fixed before any fine-tuning run (2026-11-29; README.md here): full fine-tuning (trainable all),
# 3 epochs, batch 4 documents, AdamW at the learning rate of {1e-5, 3e-5, 1e-4} whose chosen epoch scores best on the
# teacher's choose split, reused for both students; each run trains on the first 500 training documents, chooses its
# epoch on the first 300 choose documents and reports the first 1000 report documents (PIQA: all 459)
# (lit_dof.evaluation.finetune_splits: ARC-Easy Train / Dev / Test; PIQA's validation set by index).
# Resumable: each pass skips finished runs (a run killed mid-way starts again). Env: LIT_DOF_CORPUS (the corpus
# file, for the fits), LIT_DOF_DATA (task data), OUT (cells; default runs/finetune), REPORT_DIR (default: this
# folder), TASKS (default: arc_easy piqa).
set -u
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
common=(--rows '[teacher, fix, dof]' --budgets '[64]' --out "${OUT:-runs/finetune}"
        --report_dir "${REPORT_DIR:-docs/results/finetune}" --finetune_lrs '[1e-5, 3e-5, 1e-4]'
        --finetune_args '[--data.init_args.train_limit=500, --data.init_args.choose_limit=300,
                          --data.init_args.report_limit=1000, --trainer.enable_progress_bar=false]')
lit-dof compare "${common[@]}" --stages '[fit]' || exit 1  # the students first (each resumes from last.ckpt)
for task in ${TASKS:-arc_easy piqa}; do
  echo "=== finetune $task $(date)"
  lit-dof compare "${common[@]}" --stages '[finetune]' --finetune_tasks "[$task]" || echo "task $task failed: $?"
done
echo "=== done $(date)"
