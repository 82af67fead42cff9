#!/usr/bin/env bash
# The prepared GPU check: what runs first whenever a GPU is lent (docs/results/gpu/README.md), inside 10 minutes
# (each step's limit: 30 + 100 + 100 + 150 + 170 s).
#
#   1. env.txt        device, driver, versions
#   2. tests.log      the CUDA tests (kernel parity against the float64 CPU reference, fp32 and bf16; 16-mixed fits)
#   3. bench.log      scripts/bench_attention.py: the shipped sliding-window + linear layer (PyTorch kernels, then
#                     the window by compiled flex_attention and the far term by fla: the `gpu` extra must be
#                     installed), the pure linear layer and the gated delta-rule far memory against SDPA at
#                     SmolLM2's and Llama-3-8B's head shapes, T 8k and 32k, fp32 and bf16
#   4. quickstart.*   the quickstart recipe (LoRA tail included) for FIT_STEPS steps at a GPU batch (16 x 1024
#                     tokens) on SmolLM2-135M's architecture with random weights: tokens/s and peak memory beside
#                     `lit-dof plan` (scripts/fit_check.py)
#   5. llama-3-8b.*   Llama-3-8B's architecture (configs/models/llama-3-8b), random bf16 weights drawn on the GPU,
#                     through layer-wise and tail steps on one GPU: measured peak beside `lit-dof plan`'s estimate
#   6. summary.txt    each step's exit status and its result lines
#
# Every step runs under its own time limit and the next step runs whatever the last one did; the exit status is
# the number of failed steps. Weights are random (a step's time and memory do not depend on their values), so
# nothing large is copied to the machine: only config.json and a tokenizer (--arch DIR).
#
# Usage: scripts/gpu_check.sh [--dry-run] [--out DIR] [--arch DIR] [--corpus FILE] [--fit-steps N]
#   --dry-run     the same steps on the CPU with tiny shapes (TinyStories-656K's architecture, the tiny
#                 Llama-3-8B family, 128-token blocks, float32 kernels only): CI runs it, so the script itself is tested
#   --out DIR     where the logs go (default: $OUT, else gpu_check_out)
#   --arch DIR    a folder with SmolLM2-135M's config.json and tokenizer (default: the embedded teacher's
#                 converted folder; dry run: $LIT_DOF_DATA/../models/TinyStories-656K)
#   --corpus FILE the training text (default: $LIT_DOF_CORPUS, else $LIT_DOF_DATA/wikipedia/*.txt.gz)
#   --fit-steps N steps of the quickstart fit (default 200; dry run 8)
#   --steps LIST  run only these steps, e.g. bench,llama-3-8b (a rerun inside the same lease); default all
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ARGS=("$@")
DRY=0 OUTDIR=${OUT:-gpu_check_out} ARCH="" CORPUS=${LIT_DOF_CORPUS:-} FIT_STEPS="" ONLY="" STEPS=all
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --only) ONLY=$2; shift ;;  # internal: run one step (each step is this script again, under `timeout`)
    --steps) STEPS=$2; shift ;;
    --out) OUTDIR=$2; shift ;;
    --arch) ARCH=$2; shift ;;
    --corpus) CORPUS=$2; shift ;;
    --fit-steps) FIT_STEPS=$2; shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
DATA=${LIT_DOF_DATA:-../shared/data}
[ -n "$CORPUS" ] || CORPUS=$(ls "$DATA"/wikipedia/*.txt.gz 2>/dev/null | head -1)
if [ ! -f "$CORPUS" ]; then
  echo "gpu_check.sh: no corpus: pass --corpus FILE or set LIT_DOF_CORPUS (or LIT_DOF_DATA with wikipedia/)" >&2
  exit 2
fi
if [ -z "$ARCH" ]; then
  if [ $DRY = 1 ]; then ARCH=$DATA/../models/TinyStories-656K
  else ARCH=$($PY -c "from lit_dof.teacher.loading import resolve_source; print(resolve_source('smollm2-135m-instruct'))") || exit 2
  fi
fi
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
if [ -z "$ONLY" ]; then
  export GPU_CHECK_WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
  trap 'rm -rf "$GPU_CHECK_WORK"' EXIT
fi
WORK=${GPU_CHECK_WORK:?--only is internal: run the whole script}
export LIT_DOF_CORPUS=$CORPUS PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SUMMARY=$OUTDIR/summary.txt
FAILED=0

step() {  # step NAME SECONDS: run this script's function NAME with a time limit, log to OUT/NAME.log
  local name=$1 limit=$2 start rc
  case ",$STEPS," in *",$name,"*|",all,") ;; *) return ;; esac
  start=$(date +%s)
  timeout --signal=INT --kill-after=20 "$limit" "$0" "${ARGS[@]}" --only "$name" >"$OUTDIR/$name.log" 2>&1
  rc=$?
  [ $rc = 0 ] || FAILED=$((FAILED + 1))
  echo "step $name rc=$rc seconds=$(($(date +%s) - start))" | tee -a "$SUMMARY"
}

if [ $DRY = 1 ]; then
  DEVICE=cpu LENGTHS="128" CONTEXTS="128" MIN_TIME=0.01 FIT_STEPS=${FIT_STEPS:-8} LLAMA_STEPS=3 DTYPES=float32
  TRAINER=(--trainer.accelerator cpu --trainer.precision 32-true --trainer.log_every_n_steps 1)
  # the quickstart's exact-head probe reads 1024-token items, past TinyStories' 512 positions: one head listed instead
  QS_DATA=(--data.init_args.batch_size 2 --data.init_args.seq_len 128 --model.init_args.exact_heads "{1: [0]}")
  LLAMA_CONFIG=configs/models/llama-3-8b-tiny LLAMA_DATA=(--data.init_args.seq_len 64)
  DRAW=(--dtype float32 --device cpu) PLANNER=64 PYTEST=(--collect-only -q)
else
  DEVICE=cuda LENGTHS="8192 32768" CONTEXTS="8192 32768" MIN_TIME=0.3 FIT_STEPS=${FIT_STEPS:-200} LLAMA_STEPS=24
  DTYPES="float32 bfloat16"
  TRAINER=()
  QS_DATA=(--data.init_args.batch_size 16 --data.init_args.seq_len 1024)
  LLAMA_CONFIG=configs/models/llama-3-8b LLAMA_DATA=()
  DRAW=(--dtype bfloat16 --device cuda) PLANNER=512 PYTEST=(-q -rs)
fi

env() {
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  $PY -c 'import sys, torch; from importlib.metadata import version as v
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      *(f"{name} {v(name)}" for name in ("transformers", "lightning", "peft", "jsonargparse")))'
  git log -1 --format='commit %H %s' 2>/dev/null
  echo "dry_run=$DRY arch=$ARCH corpus=$CORPUS"
}

tests() { $PY -m pytest "${PYTEST[@]}" -p no:cacheprovider tests/attention/test_cuda.py tests/pipeline/test_precision.py; }

bench() {
  $PY scripts/bench_attention.py --device $DEVICE --dtype $DTYPES --shape smollm2 llama-3-8b \
    --layer sliding --lengths $LENGTHS --decode-contexts $CONTEXTS --min-time $MIN_TIME || return
  [ $DRY = 1 ] || $PY scripts/bench_attention.py --device $DEVICE --dtype float32 bfloat16 --shape smollm2 \
    llama-3-8b --layer sliding --window-kernel flex --linear-kernel fla --lengths $LENGTHS \
    --decode-contexts $CONTEXTS --min-time $MIN_TIME
  $PY scripts/bench_attention.py --device $DEVICE --dtype bfloat16 --shape smollm2 --layer linear \
    --lengths $LENGTHS --decode-contexts $CONTEXTS --min-time $MIN_TIME
  $PY scripts/bench_attention.py --device $DEVICE --dtype bfloat16 --shape smollm2 --layer sliding --far-gate \
    --far-memory delta --linear-kernel $([ $DRY = 1 ] && echo torch || echo fla) --lengths $LENGTHS \
    --decode-contexts $CONTEXTS --min-time $MIN_TIME
}

RUNS=(--trainer.logger.init_args.save_dir "$WORK/runs" --trainer.enable_progress_bar false)
quickstart() {
  $PY -m lit_dof.teacher.random_init "$WORK/smollm2" --config "$ARCH" --tokenizer "$ARCH" || return
  $PY scripts/fit_check.py --name quickstart --out "$OUTDIR" -- --config configs/quickstart.yaml \
    --config configs/trainer/gpu.yaml "${TRAINER[@]}" "${RUNS[@]}" --model.init_args.teacher "$WORK/smollm2" \
    --trainer.max_steps "$FIT_STEPS" "${QS_DATA[@]}"
}

llama() {
  $PY -m lit_dof.teacher.random_init "$WORK/llama" --config $LLAMA_CONFIG --tokenizer "$ARCH" --pad-vocab \
    "${DRAW[@]}" || return
  $PY scripts/fit_check.py --name llama-3-8b --out "$OUTDIR" -- --config configs/models/llama-3-8b.yaml \
    --config configs/trainer/gpu.yaml "${TRAINER[@]}" "${RUNS[@]}" --model.init_args.teacher "$WORK/llama" \
    --trainer.max_steps $LLAMA_STEPS --trainer.log_every_n_steps 1 --model.init_args.finetune_fraction 0.5 \
    --model.init_args.export_dir "" \
    --model.init_args.planner.init_args.num_samples $PLANNER --model.init_args.planner.init_args.num_batches 1 \
    "${LLAMA_DATA[@]}"
  local rc=$?
  rm -rf "$WORK/llama"
  return $rc
}

if [ -n "$ONLY" ]; then
  case "$ONLY" in
    env|tests|bench|quickstart) "$ONLY" ;;
    llama-3-8b) llama ;;
    *) echo "gpu_check.sh: no step $ONLY" >&2; exit 2 ;;
  esac
  exit
fi
: >"$SUMMARY"
step env 30
[ ! -f "$OUTDIR/env.log" ] || mv "$OUTDIR/env.log" "$OUTDIR/env.txt"
step tests 100
step bench 100
step quickstart 150
step llama-3-8b 170
{ echo "--- results"; grep -h -E "^(fit_check|speedup|gpu=|device=|fwd|decode|[0-9]+ (passed|failed)|.* passed)" \
    "$OUTDIR"/bench.log "$OUTDIR"/tests.log "$OUTDIR"/quickstart.log "$OUTDIR"/llama-3-8b.log 2>/dev/null; } >>"$SUMMARY"
echo "gpu_check failed_steps=$FAILED" | tee -a "$SUMMARY"
exit $FAILED
