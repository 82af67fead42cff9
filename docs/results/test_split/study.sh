#!/bin/bash
# Issue #40's test-split study: the quickstart at seeds 0, 1, 2 beside its controls (a, b, c) and the teacher.
# Endpoints fixed before any measurement (2026-11-27; README.md here): ppl = sliding-window perplexity on the test
# split (16384 tokens); long documents = the first 12 of the long-document test set, up to 8192 tokens each;
# retrieval = passkey, contexts 1024/2048/4096/8192, depths 0/0.25/0.5/0.75/1, 1 trial per cell; tasks = the seven
# (full sets, MMLU 18 per subject, LogiQA all 651) and 5-shot MMLU (18 per subject).
# Resumable: each pass skips finished records. Env: LIT_DOF_CORPUS (the corpus file), LIT_DOF_DATA (task data),
# OUT (cells; default runs/test_split), REPORT_DIR (default: this folder), ROUNDS (default 3).
set -u
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
common=(--rows '[teacher, quickstart]' --controls '[quickstart]' --seeds '[0, 1, 2]' --out "${OUT:-runs/test_split}"
        --report_dir "${REPORT_DIR:-docs/results/test_split}" --long_documents 12 --retrieval_tasks '[passkey]'
        --retrieval.contexts '[1024, 2048, 4096, 8192]' --retrieval.depths '[0.0, 0.25, 0.5, 0.75, 1.0]'
        --retrieval.trials 1 --tasks '[logiqa, mmlu, mmlu_5shot, piqa, arc_easy, arc_challenge, winogrande, wsc273]')
lit-dof compare "${common[@]}" --stages '[fit]' || exit 1  # the three fits first (each resumes from last.ckpt)
for round in $(seq "${ROUNDS:-3}"); do
  for stage in ppl retrieval long_documents eval; do
    echo "=== round $round stage $stage $(date)"
    extra=(); [ "$stage" = retrieval ] && extra=(--eval_batch_size 1)  # generation one prompt at a time: no padding
    lit-dof compare "${common[@]}" "${extra[@]}" --stages "[$stage]" || echo "stage $stage failed: $?"
  done
done
echo "=== done $(date)"
