#!/bin/bash
# Issue #41, item 1: DoF against Fix in the shipped recipe (quickstart_heads: window 64 + 4 sinks, the decaying
# position-free far term, 18 exact KV heads, LoRA tail), 5 seeds per arm, paired by seed. Design fixed before any
# fit (2026-11-30; README.md here, "The study: design"). Arms at equal Σ M (docs/results/seeds/arms.py):
#   dof       quickstart_heads           C = 64  (the shipped recipe)
#   fix       quickstart_heads_fix       C = 66  (Σ M 1,584 against DoF's 1,586)
#   dof_head  quickstart_heads_dof_head  C = 68  (one M per KV head, multiples of 8: Σ M 1,595)
#   fix16     quickstart_heads_fix       C = 16  (the dose check: Σ M 384)
# Seed s > 0 sets the initialisation, the data order and the DoF estimate's sample (lit-dof compare --seeds); every
# arm's fits come seed by seed, so a stopped study leaves whole seeds paired. Each fit is measured beside its (a)
# and (b) (the teacher behind the window + sinks and behind the equal-state window, the same exact heads): test-split
# perplexity by position, the 12 long test documents, passkey and recall (1k/2k/4k × 5 depths × 2 trials), LogiQA
# (651) and 5-shot MMLU (18 per subject); the teacher once, in the C = 64 folder.
# A cell is measured as soon as it is fitted: its report (the durable record) carries it should OUT be lost. The
# teacher comes last. Resumable: each pass skips finished cells (a fit resumes from last.ckpt). Env: LIT_DOF_CORPUS,
# LIT_DOF_DATA (task data), OUT (cells; default runs/seeds), REPORT_DIR (default: this folder's reports/), SEEDS
# (default '0 1 2 3 4'), STAGES (the measuring stages after the fits, in order; default 'ppl long_documents
# retrieval eval'), ARMS (default all four, as 'row:C ...'), NO_HEADS_TASKS (set: skip issue #40's task pass,
# docs/results/test_split/heads_tasks.sh, that follows the `dof` cells of seeds 0-2 while their checkpoints exist).
set -u
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
arms=${ARMS:-quickstart_heads:64 quickstart_heads_fix:66 quickstart_heads_dof_head:68 quickstart_heads_fix:16}
out=${OUT:-runs/seeds}
reports=${REPORT_DIR:-docs/results/seeds/reports}
run() {  # run ROW C SEEDS STAGE [extra args]: one lit-dof compare call for one arm
  local row=$1 budget=$2 seeds=$3 stage=$4; shift 4
  local rows="[$row]"; [ "$budget" = 64 ] && [ -z "${NO_TEACHER:-}" ] && rows="[teacher, $row]"
  lit-dof compare --rows "$rows" --controls "[$row]" --control_kinds '[window_sinks, equal_state]' \
    --budgets "[$budget]" --seeds "$seeds" --out "$out" \
    --report_dir "$reports/${row}_C$budget" --long_documents 12 --retrieval_tasks '[passkey, recall]' \
    --retrieval.contexts '[1024, 2048, 4096]' --retrieval.depths '[0.0, 0.25, 0.5, 0.75, 1.0]' \
    --retrieval.trials 2 --tasks '[logiqa, mmlu_5shot]' --stages "[$stage]" "$@"
}
all="[$(echo ${SEEDS:-0 1 2 3 4} | sed 's/ /, /g')]"
measure() {  # measure ARM [args]: each measuring stage of one arm, every seed fitted so far (the rest not ready)
  local arm=$1; shift
  for stage in ${STAGES:-ppl long_documents retrieval eval}; do
    echo "=== $stage ${arm%:*} C=${arm#*:} $(date)"
    extra=(); [ "$stage" = retrieval ] && extra=(--retrieval_batch_size 1)  # one prompt per forward: no padding
    run "${arm%:*}" "${arm#*:}" "$all" "$stage" "${extra[@]}" "$@" || echo "stage $stage of $arm failed: $?"
  done
}
for seed in ${SEEDS:-0 1 2 3 4}; do
  for arm in $arms; do
    echo "=== fit ${arm%:*} C=${arm#*:} seed $seed $(date)"
    run "${arm%:*}" "${arm#*:}" "[$seed]" fit || exit 1
    NO_TEACHER=1 measure "$arm"
    if [ "$arm" = quickstart_heads:64 ] && [ "$seed" -le 2 ] && [ -z "${NO_HEADS_TASKS:-}" ]; then
      echo "=== issue #40's tasks on this fit $(date)"  # while its checkpoint is here (docs/results/test_split)
      OUT=$out bash docs/results/test_split/heads_tasks.sh || echo "issue #40's tasks failed: $?"
    fi
  done
done
for arm in $arms; do [ "${arm#*:}" = 64 ] && measure "$arm"; done  # the teacher, once, in the C = 64 folder
echo "=== done $(date)"
