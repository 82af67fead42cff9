#!/bin/bash
# Issue #41, item 1: DoF against Fix in the shipped recipe (quickstart_heads: window 64 + 4 sinks, the decaying
# position-free far term, 18 exact KV heads, LoRA tail), 5 seeds per arm, paired by seed. Design fixed before any
# fit (2026-11-30; README.md here, "The study: design"). Arms at equal Σ M (docs/results/seeds/arms.py):
#   dof       quickstart_heads           C = 64  (the shipped recipe)
#   fix       quickstart_heads_fix       C = 66  (Σ M 1,584 against DoF's 1,586)
#   dof_head  quickstart_heads_dof_head  C = 68  (one M per KV head, multiples of 8: Σ M 1,595)
#   fix16     quickstart_heads_fix       C = 16  (the dose check: Σ M 384)
# Seed s > 0 sets the initialisation, the data order and the DoF estimate's sample (lit-dof compare --seeds); every
# arm's fits come seed by seed, so a stopped study leaves whole seeds paired. Then, per arm beside its (a) and (b)
# (the teacher behind the window + sinks and behind the equal-state window, the same exact heads): test-split
# perplexity by position, the 12 long test documents, passkey and recall (1k/2k/4k × 5 depths × 2 trials), LogiQA
# (651) and 5-shot MMLU (18 per subject); the teacher once, in the C = 64 folder.
# Resumable: each pass skips finished cells (a fit resumes from last.ckpt). Env: LIT_DOF_CORPUS (the corpus file),
# LIT_DOF_DATA (task data), OUT (cells; default runs/seeds), REPORT_DIR (default: this folder's reports/), SEEDS
# (default '0 1 2 3 4'), STAGES (the measuring stages after the fits, in order; default 'ppl long_documents
# retrieval eval'), ARMS (default all four, as 'row:C ...').
set -u
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
arms=${ARMS:-quickstart_heads:64 quickstart_heads_fix:66 quickstart_heads_dof_head:68 quickstart_heads_fix:16}
out=${OUT:-runs/seeds}
reports=${REPORT_DIR:-docs/results/seeds/reports}
run() {  # run ROW C SEEDS STAGE [extra args]: one lit-dof compare call for one arm
  local row=$1 budget=$2 seeds=$3 stage=$4; shift 4
  local rows="[$row]"; [ "$budget" = 64 ] && rows="[teacher, $row]"
  lit-dof compare --rows "$rows" --controls "[$row]" --control_kinds '[window_sinks, equal_state]' \
    --budgets "[$budget]" --seeds "$seeds" --out "$out" \
    --report_dir "$reports/${row}_C$budget" --long_documents 12 --retrieval_tasks '[passkey, recall]' \
    --retrieval.contexts '[1024, 2048, 4096]' --retrieval.depths '[0.0, 0.25, 0.5, 0.75, 1.0]' \
    --retrieval.trials 2 --tasks '[logiqa, mmlu_5shot]' --stages "[$stage]" "$@"
}
for seed in ${SEEDS:-0 1 2 3 4}; do
  for arm in $arms; do
    echo "=== fit ${arm%:*} C=${arm#*:} seed $seed $(date)"
    run "${arm%:*}" "${arm#*:}" "[$seed]" fit || exit 1
  done
done
all="[$(echo ${SEEDS:-0 1 2 3 4} | sed 's/ /, /g')]"
for stage in ${STAGES:-ppl long_documents retrieval eval}; do
  for arm in $arms; do
    echo "=== $stage ${arm%:*} C=${arm#*:} $(date)"
    extra=(); [ "$stage" = retrieval ] && extra=(--retrieval_batch_size 1)  # one prompt per forward: no padding
    run "${arm%:*}" "${arm#*:}" "$all" "$stage" "${extra[@]}" || echo "stage $stage of $arm failed: $?"
  done
done
echo "=== done $(date)"
