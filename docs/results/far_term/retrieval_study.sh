#!/bin/bash
# Issue #45's test-split study of the retrieval-layer candidate: quickstart_retrieval (the quickstart recipe with
# layers 7, 8, 14, 18, 20, 23 kept softmax, chosen on validation recall) at seeds 0, 1, 2 beside its controls — (a)
# the teacher behind window 64 + 4 sinks in the other 24 layers, (b) behind the equal-state window there, (c) its
# LoRA-merged weights with full attention, (d) its far terms alone — and the teacher.
# Endpoints fixed before any test measurement (2026-11-28; README.md here, "Retrieval layers on the test split"):
# ppl = sliding-window perplexity on the test split (16384 tokens; by position: 256–511 for the bars); long documents
# = the first 12 of the long-document test set (in-document 2048–4095 for the bars); retrieval = passkey and recall
# at 1024/2048/4096 tokens × depths 0/0.25/0.5/0.75/1 × 2 trials (30 prompts per task and model; passkey generated
# one prompt per forward, recall teacher-forced in test documents; the bar reads 2k and 4k at depths 0.25–0.75).
# The quickstart's study's protocol (docs/results/test_split) with a second trial per cell, recall, and no 8k cell
# (one 8k prompt takes the teacher ≈ 70 s on 2 cores; the bars are at 2k and 4k).
# Resumable: each pass skips finished records. Env: LIT_DOF_CORPUS (the corpus file), OUT (cells; default
# runs/far_term_test), REPORT_DIR (default: docs/results/far_term/retrieval_test), SEEDS (default '[0, 1, 2]'),
# ROW (default quickstart_retrieval; quickstart_heads runs the same protocol for the exact-KV-head candidate), STAGES
# (the measuring stages after the fits, in order; default 'ppl retrieval long_documents'), KINDS (the controls the
# retrieval and long-document stages measure, e.g. '[window_sinks, equal_state]' for (a) and (b) only; default every
# control; when set, a last perplexity pass, all cached, writes the report with every control's perplexity).
set -u
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
row=${ROW:-quickstart_retrieval}
common=(--rows "[teacher, $row]" --controls "[$row]" --seeds "${SEEDS:-[0, 1, 2]}"
        --out "${OUT:-runs/far_term_test}" --report_dir "${REPORT_DIR:-docs/results/far_term/retrieval_test}"
        --long_documents 12 --retrieval_tasks '[passkey, recall]' --retrieval.contexts '[1024, 2048, 4096]'
        --retrieval.depths '[0.0, 0.25, 0.5, 0.75, 1.0]' --retrieval.trials 2)
lit-dof compare "${common[@]}" --stages '[fit]' || exit 1  # the fits first (each resumes from last.ckpt)
for stage in ${STAGES:-ppl retrieval long_documents}; do
  echo "=== stage $stage $(date)"
  extra=(); [ "$stage" = retrieval ] && extra=(--retrieval_batch_size 1)  # one prompt per forward: no padding
  [ -n "${KINDS:-}" ] && [ "$stage" != ppl ] && extra+=(--control_kinds "$KINDS")
  lit-dof compare "${common[@]}" "${extra[@]}" --stages "[$stage]" || echo "stage $stage failed: $?"
done
[ -n "${KINDS:-}" ] && { lit-dof compare "${common[@]}" --stages '[ppl]' || echo "report failed: $?"; }
echo "=== done $(date)"
