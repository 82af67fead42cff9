#!/bin/bash
# Issue #45, "Repeated spans with the decay per feature, three seeds: design" (docs/results/far_term README): fits of
# quickstart_heads_feature_decay_copy at seeds 2, 0 and 1 (seed 2 first: the seed the feature-decay row misses with),
# each with its validation perplexity and the 30 choosing passkey prompts (retrieval seed 1, 2k and 4k) as soon as it
# is fitted; then seed 0's 40 recall items, quickstart_heads_feature_decay's validation perplexity at seeds 1 and 2
# (its test-split study's fits, no new fit: the pairs by seed) and the rule (records/copy_seeds_rule.py).
# Resumable: each compare call skips what is done. Env: LIT_DOF_CORPUS (the Wikipedia file), OUT (fits; default
# runs/far_term), TEST_OUT (the feature-decay row's test-split cells; default runs/far_term_test).
set -eu
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
row=quickstart_heads_feature_decay_copy base=quickstart_heads_feature_decay
out=${OUT:-runs/far_term} test_out=${TEST_OUT:-runs/far_term_test} records=docs/results/far_term/records
grid=(--retrieval.contexts '[2048, 4096]' --retrieval.depths '[0.1, 0.3, 0.5, 0.7, 0.9]')
copy() {  # copy SOURCE_CELL DEST_CELL: a fitted cell without its measures (the destination measures anew)
  if [ ! -d "$2" ]; then
    mkdir -p "$(dirname "$2")" && cp -r "$1" "$2" && rm -rf "$2/retrieval" "$2/controls" "$2/ppl.json" "$2/long_documents.json"
  fi
}
cell() { if [ "$1" = 0 ]; then echo "C64/$2"; else echo "C64/seed$1/$2"; fi; }  # cell SEED ROW
for seed in 2 0 1; do
  lit-dof compare --rows "[$row]" --seeds "[$seed]" --stages '[fit, ppl]' --ppl_split validation --out "$out"
  copy "$out/$(cell "$seed" "$row")" "${out}_copy/$(cell "$seed" "$row")"
  lit-dof compare --rows "[$row]" --seeds "[$seed]" --stages '[retrieval]' --retrieval_tasks '[passkey]' "${grid[@]}" \
    --retrieval.trials 3 --retrieval.seed 1 --retrieval_batch_size 1 --out "${out}_copy"
done
lit-dof compare --rows "[$row]" --stages '[retrieval]' --retrieval_tasks '[recall]' "${grid[@]}" \
  --retrieval.trials 4 --out "$out"
for seed in 1 2; do copy "$test_out/$(cell "$seed" "$base")" "${out}_val/$(cell "$seed" "$base")"; done
lit-dof compare --rows "[$base]" --seeds '[1, 2]' --stages '[ppl]' --ppl_split validation --out "${out}_val"
for seed in 0 1 2; do
  tag=$([ "$seed" = 0 ] && echo "" || echo "_seed$seed")
  cp "$out/$(cell "$seed" "$row")/fit.json" "$records/${row}${tag}_fit.json"
  cp "$out/$(cell "$seed" "$row")/ppl.json" "$records/${row}${tag}_ppl.json"
  cp "${out}_copy/$(cell "$seed" "$row")/retrieval/passkey.json" "$records/${row}${tag}_choose_passkey.json"
  [ "$seed" = 0 ] || cp "${out}_val/$(cell "$seed" "$base")/ppl.json" "$records/${base}${tag}_ppl.json"
done
cp "$out/C64/$row/retrieval/recall.json" "$records/${row}_recall.json"
python docs/results/far_term/records/copy_seeds_rule.py "$out" "${out}_copy" "${out}_val"
