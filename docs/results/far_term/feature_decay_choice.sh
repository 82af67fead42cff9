#!/bin/bash
# Issue #45, "A decay per feature: design" (docs/results/far_term README), and with
# ROW=quickstart_heads_feature_decay_long BESIDE=quickstart_heads_feature_decay "A decay per feature on long blocks:
# design": one fit (seed 0) of the row and the measures of its rule — validation perplexity and the 40 recall items, the 30
# choosing passkey prompts (retrieval seed 1), the long choosing set beside its (a) and (b), and where its far mass
# goes by depth — then the rule (records/long_rule.py --condition long). The neighbours' numbers are the committed
# records (quickstart_heads seed 0: records/quickstart_heads_*.json, records/long_choice.json). Resumable: each step
# skips what is done. Env: LIT_DOF_CORPUS (the Wikipedia file), OUT (default runs/far_term), BUDGET (the row's C,
# default 64; another C fits in C<BUDGET>/ and names the records <row>_C<BUDGET>), BESIDE, ROW.
set -eu
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
row=${ROW:-quickstart_heads_feature_decay} out=${OUT:-runs/far_term} records=docs/results/far_term/records
budget=${BUDGET:-64} name=$row
[ "$budget" = 64 ] || name=${row}_C$budget
lit-dof compare --rows "[$row]" --budgets "[$budget]" --stages '[fit, ppl, retrieval]' --retrieval_tasks '[recall]' \
  --retrieval.contexts '[2048, 4096]' --retrieval.depths '[0.1, 0.3, 0.5, 0.7, 0.9]' --retrieval.trials 4 \
  --ppl_split validation --out "$out"
if [ ! -d "${out}_copy/C$budget/$row" ]; then  # the choosing prompts (seed 1) in a copy of the cell, not the recall's
  mkdir -p "${out}_copy/C$budget" && cp -r "$out/C$budget/$row" "${out}_copy/C$budget/$row"
  rm -rf "${out}_copy/C$budget/$row/retrieval"
fi
lit-dof compare --rows "[$row]" --budgets "[$budget]" --stages '[retrieval]' --retrieval_tasks '[passkey]' \
  --retrieval.contexts '[2048, 4096]' --retrieval.depths '[0.1, 0.3, 0.5, 0.7, 0.9]' --retrieval.trials 3 \
  --retrieval.seed 1 --retrieval_batch_size 1 --out "${out}_copy"
student=$(ls -d "$out/C$budget/$row"/runs/*/version_*/student | tail -1)
cp "$out/C$budget/$row/fit.json" "$records/${name}_fit.json"
cp "$out/C$budget/$row/ppl.json" "$records/${name}_ppl.json"
cp "$out/C$budget/$row/retrieval/recall.json" "$records/${name}_recall.json"
cp "${out}_copy/C$budget/$row/retrieval/passkey.json" "$records/${name}_choose_passkey.json"
python docs/results/far_term/records/long_choice.py "$LIT_DOF_CORPUS" "$name=$student" --out "$records/long_choice.json"
python tools/far_mass.py "$student" --corpus "$LIT_DOF_CORPUS" --context 4096 --queries 16 --long-articles 12 \
  --per-layer 2>/dev/null | sed "s#^$out/#runs/far_term/#" > "$records/far_mass_${name#quickstart_heads_}.txt"
python tools/state_share.py "$student" --context 4096 | sed "s#^$out/#runs/far_term/#" > "$records/${name}_state.txt"
python docs/results/far_term/records/learned_decay.py "$student" --save "$records/${name}_tau.json" | tail -3
python docs/results/far_term/records/long_rule.py "$out" "${out}_copy" --row "$row" --budget "$budget" --condition long \
  ${BESIDE:+--beside "$BESIDE"}
