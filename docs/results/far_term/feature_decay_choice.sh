#!/bin/bash
# Issue #45, "A decay per feature: design" (docs/results/far_term README), and with
# ROW=quickstart_heads_feature_decay_long BESIDE=quickstart_heads_feature_decay "A decay per feature on long blocks:
# design": one fit (seed 0) of the row and the measures of its rule — validation perplexity and the 40 recall items, the 30
# choosing passkey prompts (retrieval seed 1), the long choosing set beside its (a) and (b), and where its far mass
# goes by depth — then the rule (records/long_rule.py --condition long). The neighbours' numbers are the committed
# records (quickstart_heads seed 0: records/quickstart_heads_*.json, records/long_choice.json). Resumable: each step
# skips what is done. Env: LIT_DOF_CORPUS (the Wikipedia file), OUT (default runs/far_term).
set -eu
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
row=${ROW:-quickstart_heads_feature_decay} out=${OUT:-runs/far_term} records=docs/results/far_term/records
lit-dof compare --rows "[$row]" --stages '[fit, ppl, retrieval]' --retrieval_tasks '[recall]' \
  --retrieval.contexts '[2048, 4096]' --retrieval.depths '[0.1, 0.3, 0.5, 0.7, 0.9]' --retrieval.trials 4 \
  --ppl_split validation --out "$out"
if [ ! -d "${out}_copy/C64/$row" ]; then  # the choosing prompts (seed 1) in a copy of the cell, not the recall's
  mkdir -p "${out}_copy/C64" && cp -r "$out/C64/$row" "${out}_copy/C64/$row" && rm -rf "${out}_copy/C64/$row/retrieval"
fi
lit-dof compare --rows "[$row]" --stages '[retrieval]' --retrieval_tasks '[passkey]' \
  --retrieval.contexts '[2048, 4096]' --retrieval.depths '[0.1, 0.3, 0.5, 0.7, 0.9]' --retrieval.trials 3 \
  --retrieval.seed 1 --retrieval_batch_size 1 --out "${out}_copy"
student=$(ls -d "$out/C64/$row"/runs/*/version_*/student | tail -1)
cp "$out/C64/$row/fit.json" "$records/${row}_fit.json"
cp "$out/C64/$row/ppl.json" "$records/${row}_ppl.json"
cp "$out/C64/$row/retrieval/recall.json" "$records/${row}_recall.json"
cp "${out}_copy/C64/$row/retrieval/passkey.json" "$records/${row}_choose_passkey.json"
python docs/results/far_term/records/long_choice.py "$LIT_DOF_CORPUS" "$row=$student" --out "$records/long_choice.json"
python tools/far_mass.py "$student" --corpus "$LIT_DOF_CORPUS" --context 4096 --queries 16 --long-articles 12 \
  --per-layer 2>/dev/null | sed "s#^$out/#runs/far_term/#" > "$records/far_mass_${row#quickstart_heads_}.txt"
python docs/results/far_term/records/learned_decay.py "$student" --save "$records/${row}_tau.json" | tail -3
python docs/results/far_term/records/long_rule.py "$out" "${out}_copy" --row "$row" --condition long \
  ${BESIDE:+--beside "$BESIDE"}
