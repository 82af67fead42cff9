#!/usr/bin/env bash
# Multi-node `lit-dof fit` with torchrun: run this script once on every node, with the same MASTER_ADDR,
# MASTER_PORT and NNODES and NODE_RANK = 0 … NNODES-1. torchrun starts GPUS_PER_NODE ranks per node and Lightning
# reads them (TorchElasticEnvironment); --trainer.num_nodes / --trainer.devices are passed so that the trainer's
# world size is the launch's. Arguments after the script's name are appended to `lit-dof fit` and override the
# configs; relative paths in them are relative to the directory it is launched from. Read docs/scale.md
# ("Launching on a cluster") before spending a node-hour.
#
#   MASTER_ADDR=node0 MASTER_PORT=29500 NNODES=2 NODE_RANK=0 GPUS_PER_NODE=8 scripts/launch/torchrun.sh \
#       --model.init_args.teacher /shared/models/Meta-Llama-3-8B --data.init_args.path /shared/data/corpus.txt.gz
#
# Environment (defaults in brackets):
#   MASTER_ADDR (required), MASTER_PORT [29500], NNODES [1], NODE_RANK [0], GPUS_PER_NODE [8]
#   CONFIGS     config files, in order, space-separated [the repository's configs/models/llama-3-8b.yaml and
#               configs/trainer/fsdp.yaml]
#   PG_TIMEOUT  collective timeout (NCCL watchdog), H:MM:SS [0:30:00]
#   SUBCOMMAND  fit, or plan: print `lit-dof plan` for the same arguments on this node, without torchrun [fit]
#   HF_HUB_OFFLINE [1: the teacher must already be on disk], NCCL_DEBUG [WARN]
#   LIT_DOF [lit-dof], TORCHRUN [torchrun]   the executables
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The run writes where it is launched from (the configs' runs/…/version_N/checkpoints are relative): launch every node
# from the same directory on storage that every node sees.

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_PORT=${MASTER_PORT:-29500}
CONFIGS=${CONFIGS:-$REPO/configs/models/llama-3-8b.yaml $REPO/configs/trainer/fsdp.yaml}
PG_TIMEOUT=${PG_TIMEOUT:-0:30:00}
SUBCOMMAND=${SUBCOMMAND:-fit}
LIT_DOF=${LIT_DOF:-lit-dof}
TORCHRUN=${TORCHRUN:-torchrun}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

args=()
for config in $CONFIGS; do
    args+=(--config "$config")
done
args+=(--trainer.num_nodes "$NNODES" --trainer.devices "$GPUS_PER_NODE"
       "--trainer.strategy.init_args.timeout=$PG_TIMEOUT" "$@")

case "$SUBCOMMAND" in
    plan) exec "$LIT_DOF" plan "${args[@]}" ;;
    fit) ;;
    *) echo "torchrun.sh: SUBCOMMAND must be fit or plan, got '$SUBCOMMAND'" >&2; exit 2 ;;
esac
: "${MASTER_ADDR:?torchrun.sh: set MASTER_ADDR to the address of node 0 (the same on every node)}"
exec "$TORCHRUN" --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$GPUS_PER_NODE" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" --max_restarts 0 \
    --no-python "$LIT_DOF" fit "${args[@]}"
