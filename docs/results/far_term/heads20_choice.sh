#!/bin/bash
# Issue #45, "Two more exact heads against seed 2's miss: design" (docs/results/far_term README): fits of
# quickstart_heads_reach_1k_heads20 at SEEDS (default [2], step 1; [0, 1] for step 2), each with its validation
# perplexity (32 blocks), the 30 choosing passkey prompts (retrieval seed 1, 2k and 4k, in a copy of the cell) and
# its decode state at 4k; copies of each fit's records beside records/heads20_rule.py, which reads them last.
# Resumable: each compare call skips what is done. Env: LIT_DOF_CORPUS, OUT (default runs/far_term), SEEDS.
set -eu
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
row=quickstart_heads_reach_1k_heads20 out=${OUT:-runs/far_term} seeds=${SEEDS:-[2]}
records=docs/results/far_term/records
cell() { if [ "$1" = 0 ]; then echo "C64/$row"; else echo "C64/seed$1/$row"; fi; }  # a seed's compare cell
lit-dof compare --rows "[$row]" --seeds "$seeds" --stages '[fit, ppl]' --ppl_split validation --out "$out"
for seed in $(echo "$seeds" | tr -d '[],'); do
  cell=$(cell "$seed")
  if [ ! -d "${out}_copy/$cell" ]; then  # the choosing prompts (seed 1) in a copy of the cell
    mkdir -p "$(dirname "${out}_copy/$cell")" && cp -r "$out/$cell" "${out}_copy/$cell"
    rm -rf "${out}_copy/$cell/retrieval"
  fi
done
lit-dof compare --rows "[$row]" --seeds "$seeds" --stages '[retrieval]' --retrieval_tasks '[passkey]' \
  --retrieval.contexts '[2048, 4096]' --retrieval.depths '[0.1, 0.3, 0.5, 0.7, 0.9]' --retrieval.trials 3 \
  --retrieval.seed 1 --retrieval_batch_size 1 --out "${out}_copy"
for seed in $(echo "$seeds" | tr -d '[],'); do
  cell=$(cell "$seed")
  name=${row}_seed$seed student=$(ls -d "$out/$cell"/runs/*/version_*/student | tail -1)
  cp "$out/$cell/fit.json" "$records/${name}_fit.json"
  cp "$out/$cell/ppl.json" "$records/${name}_ppl.json"
  cp "${out}_copy/$cell/retrieval/passkey.json" "$records/${name}_choose_passkey.json"
  python tools/state_share.py "$student" --context 4096 | sed "s#^$out/#runs/far_term/#" > "$records/${name}_state.txt"
done
python docs/results/far_term/records/heads20_rule.py "$out"
