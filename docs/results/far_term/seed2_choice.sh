#!/bin/bash
# Issue #45, "Why seed 2 misses the passkeys: design" (docs/results/far_term README). Step 1, no fit: the test-split
# study's fits of quickstart_heads_feature_decay at seeds 1 and 2 on the 30 choosing passkey prompts (retrieval seed 1,
# 2k and 4k; seed 0's are committed: records/quickstart_heads_feature_decay_choose_passkey.json). Step 2 (STEP=2):
# three fits at compare seed 0, each with one of the three things seed 2 sets (rows
# quickstart_heads_feature_decay_{data2,init2,dof2}), their validation perplexity and the same choosing prompts.
# Then records/seed2_rule.py reads them. Resumable: each compare call skips what is done. Env: LIT_DOF_CORPUS,
# OUT (fits; default runs/far_term), TEST_OUT (the test-split study's cells; default runs/far_term_test), STEP (1 or 2).
set -eu
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
out=${OUT:-runs/far_term} test_out=${TEST_OUT:-runs/far_term_test} row=quickstart_heads_feature_decay
choose=(--stages '[retrieval]' --retrieval_tasks '[passkey]' --retrieval.contexts '[2048, 4096]'
        --retrieval.depths '[0.1, 0.3, 0.5, 0.7, 0.9]' --retrieval.trials 3 --retrieval.seed 1 --retrieval_batch_size 1
        --out "${out}_copy")
copy() {  # copy SOURCE_CELL DEST_CELL: a fitted cell without its retrieval records (the choosing prompts are new)
  if [ ! -d "$2" ]; then mkdir -p "$(dirname "$2")" && cp -r "$1" "$2" && rm -rf "$2/retrieval"; fi
}
for seed in 1 2; do
  copy "$test_out/C64/seed$seed/$row" "${out}_copy/C64/seed$seed/$row"
done
lit-dof compare --rows "[$row]" --seeds '[1, 2]' "${choose[@]}"
if [ "${STEP:-1}" = 2 ]; then
  rows="[${row}_data2, ${row}_init2, ${row}_dof2]"
  lit-dof compare --rows "$rows" --stages '[fit, ppl]' --ppl_split validation --out "$out"
  for part in data2 init2 dof2; do copy "$out/C64/${row}_$part" "${out}_copy/C64/${row}_$part"; done
  lit-dof compare --rows "$rows" "${choose[@]}"
fi
python docs/results/far_term/records/seed2_rule.py "${out}_copy"
