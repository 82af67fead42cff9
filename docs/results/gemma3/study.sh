#!/bin/bash
# Issue #41, item 4: the shipped recipe on a second model family — Gemma 3 270M (configs/models/gemma3-270m.yaml: the
# quickstart's window 64 + 4 sinks + decaying far term + LoRA tail on its 3 global layers, its 15 sliding-window
# layers left softmax; no exact heads) at seeds 0, 1, 2 beside its controls (a) window + sinks, (b) the equal-state
# window, (c) its LoRA-merged weights with full attention, and the teacher.
# Endpoints fixed before any measurement (2026-11-29; README.md here): ppl = sliding-window perplexity on the test
# split (16384 tokens); long documents = the first 12 of the long-document test set (in-document buckets); retrieval
# = passkey at 1024/2048/4096 tokens × depths 0/0.25/0.5/0.75/1 × 2 trials (one prompt per forward); tasks = the
# seven zero-shot tasks (MMLU 18 per subject, LogiQA all 651) with their beyond-window share.
# C = 256, the head size (what `lit-dof fit --config configs/quickstart.yaml --config configs/models/gemma3-270m.yaml`
# allocates: the planner's default budget); λ relative to the Gram trace as the model file sets it.
# Resumable: each pass skips finished records. Env: LIT_DOF_CORPUS (the corpus file), LIT_DOF_DATA (task data),
# OUT (cells; default runs/gemma3), REPORT_DIR (default: this folder), SEEDS (default '[0, 1, 2]'),
# STAGES (default: ppl long_documents retrieval eval).
set -u
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
common=(--teacher gemma3-270m --rows '[teacher, quickstart]' --controls '[quickstart]' --budgets '[256]'
        --seeds "${SEEDS:-[0, 1, 2]}" --out "${OUT:-runs/gemma3}" --report_dir "${REPORT_DIR:-docs/results/gemma3}"
        --fit_args '[--model.init_args.planner.init_args.relative_to=trace, --model.init_args.planner.init_args.lam=0.00390625]'
        --long_documents 12 --retrieval_tasks '[passkey]' --retrieval.contexts '[1024, 2048, 4096]'
        --retrieval.depths '[0.0, 0.25, 0.5, 0.75, 1.0]' --retrieval.trials 2
        --tasks '[logiqa, mmlu, piqa, arc_easy, arc_challenge, winogrande, wsc273]')
lit-dof compare "${common[@]}" --stages '[fit]' || exit 1  # the fits first (each resumes from last.ckpt)
for stage in ${STAGES:-ppl long_documents retrieval eval}; do
  echo "=== stage $stage $(date)"
  extra=(); [ "$stage" = retrieval ] && extra=(--retrieval_batch_size 1)  # one prompt per forward: no padding
  lit-dof compare "${common[@]}" "${extra[@]}" --stages "[$stage]" || echo "stage $stage failed: $?"
done
echo "=== done $(date)"
