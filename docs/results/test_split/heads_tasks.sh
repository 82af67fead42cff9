#!/bin/bash
# Issue #40's tasks for the shipped quickstart (`quickstart_heads`, since 2026-11-29): the seven zero-shot tasks
# (full sets; MMLU 18 per subject, LogiQA all 651) and 5-shot MMLU (18 per subject), with each task's share of
# examples beyond the student's exact positions, for the student at seeds 0, 1, 2 beside (a) the teacher behind its
# window 64 + 4 sinks, (b) behind its equal-state window (both with the same 18 exact heads), (c) its LoRA-merged
# weights with full attention, and the teacher. Endpoints fixed before any measurement (2026-11-30; README.md here).
# The fits are the seeds study's `dof` arm (docs/results/seeds/study.sh runs this after each of its first three
# seeds' C = 64 cells, in the same OUT): no fit of its own — a seed not fitted there is left pending.
# Resumable: finished tasks are skipped, an unfinished one resumes from its cache. Env: OUT (the seeds study's
# cells; default runs/seeds), REPORT_DIR (default: this folder), SEEDS (default '[0, 1, 2]').
set -u
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
lit-dof compare --rows '[teacher, quickstart_heads]' --controls '[quickstart_heads]' \
  --control_kinds '[window_sinks, equal_state, tail_only]' --budgets '[64]' --seeds "${SEEDS:-[0, 1, 2]}" \
  --out "${OUT:-runs/seeds}" --report_dir "${REPORT_DIR:-docs/results/test_split/heads_tasks}" \
  --tasks '[logiqa, mmlu, mmlu_5shot, piqa, arc_easy, arc_challenge, winogrande, wsc273]' --stages '[eval]'
