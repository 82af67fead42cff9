#!/usr/bin/env bash
# What a lent GPU machine needs beside the working tree, built here into two git-ignored folders for the device tool
# to carry (carry: [".whl", ".gpu"], within the 64 MiB a call takes; docs/results/gpu/README.md, "Running it"):
#   .whl/        wheels of what the machine lacks (transformers at lit-dof's pin, jsonargparse, datasets, gguf, fla;
#                its own torch, Lightning and peft are used)
#   .gpu/smollm2-135m/  SmolLM2-135M's config.json and tokenizer, no weights (gpu_check.sh draws random ones)
#   .gpu/shared/        the Wikipedia file and TinyStories-656K (the CUDA tests' tiny teacher), laid out as ../shared
#   .gpu/run.sh         the device command: installs the wheels in /tmp/site, sets the environment, then runs its
#                       arguments (default: scripts/gpu_check.sh --out $OUT --arch .gpu/smollm2-135m --fit-steps 100)
# Usage (in .venv, with ../shared or LIT_DOF_DATA): scripts/gpu_carry.sh; then give the device tool
#   bash .gpu/run.sh   or   bash .gpu/run.sh python3 scripts/fit_check.py ...   with carry [".whl", ".gpu"].
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DATA=${LIT_DOF_DATA:-../shared/data}
rm -rf .whl .gpu && mkdir -p .whl .gpu/smollm2-135m .gpu/shared/data/wikipedia .gpu/shared/models
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d .whl "transformers==$("$PY" -c 'import transformers; print(transformers.__version__)')" \
  jsonargparse docstring_parser typeshed_client datasets dill multiprocess gguf regex \
  "flash-linear-attention>=0.6,<0.7" "fla-core>=0.6,<0.7"
ARCH=$("$PY" -c "from lit_dof.teacher.loading import resolve_source; print(resolve_source('smollm2-135m-instruct'))")
cp "$ARCH"/config.json "$ARCH"/tokenizer* .gpu/smollm2-135m/
cp "$DATA"/wikipedia/enwiki_wikiextractor_AA.txt.gz .gpu/shared/data/wikipedia/
cp -r "$DATA"/../models/TinyStories-656K .gpu/shared/models/
chmod -R u+w .gpu
cat > .gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Made by scripts/gpu_carry.sh: run on the lent machine from the repository root.
set -uo pipefail
pip install --quiet --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "gpu run.sh: wheel install failed"
export PYTHONPATH=/tmp/site:$PWD:$PWD/tools PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export LIT_DOF_DATA=$PWD/.gpu/shared/data LIT_DOF_CORPUS=$PWD/.gpu/shared/data/wikipedia/enwiki_wikiextractor_AA.txt.gz
if [ $# = 0 ]; then set -- bash scripts/gpu_check.sh --out "$OUT" --arch .gpu/smollm2-135m --fit-steps 100; fi
"$@"
RUN
du -sh .whl .gpu
total=$(du -sm .whl .gpu | awk '{s += $1} END {print s}')
[ "$total" -lt 60 ] || { echo "gpu_carry.sh: .whl + .gpu take $total MiB; a device call carries 64 MiB" >&2; exit 1; }
