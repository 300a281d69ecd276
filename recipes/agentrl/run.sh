#!/usr/bin/env bash
# AgentRL on AgentBench-FC with verl: one Qwen2.5 size (or one GPU) per run.
#   bash recipes/agentrl/run.sh SIZE MODEL_PATH CONTROLLER_URL DATA_DIR [HYDRA_OVERRIDE ...]
#     SIZE            3b | 7b | 14b | 32b  (picks config/agentrl_qwen2.5_SIZE.yaml: GPUs, tensor parallelism)
#                     1gpu                 (config/agentrl_1gpu.yaml: one card, the hf rollout, any model that fits)
#     MODEL_PATH      local folder or hub id of the model
#     CONTROLLER_URL  the environment controller (agentrl-env up env/agentbench_fc.yaml), e.g. http://env:5020
#     DATA_DIR        folder with train.parquet / val.parquet from prepare_data.sh
# Multi-node: start a Ray cluster over the nodes first (ray start --head / ray start --address=...), then run this
# on the head node. Synchronous steps instead of the asynchronous pipeline: add trainer.v1.trainer_mode=agentrl_sync.
# The controller's token is read from AGENTRL_ENV_TOKEN_FILE (default ~/.agentrl/env.token, what `agentrl-env up`
# wrote for the recipe's stack), which every node must be able to read.
set -euo pipefail
if [ $# -lt 4 ]; then sed -n 2,10p "$0"; exit 2; fi
SIZE=$1 MODEL=$2 URL=$3 DATA=$4
shift 4
HERE=$(cd "$(dirname "$0")" && pwd)
case $SIZE in
  3b|7b|14b|32b) CONFIG=agentrl_qwen2.5_$SIZE ;;
  1gpu) CONFIG=agentrl_1gpu ;;
  *) echo "SIZE must be 3b, 7b, 14b, 32b or 1gpu, got '$SIZE'" >&2; exit 2 ;;
esac
exec python3 -m verl.trainer.main_ppo \
  --config-path "$HERE/config" --config-name "$CONFIG" \
  actor_rollout_ref.model.path="$MODEL" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/val.parquet" \
  agentrl.env.url="$URL" \
  agentrl.env.token_file="${AGENTRL_ENV_TOKEN_FILE:-$HOME/.agentrl/env.token}" \
  trainer.default_local_dir="checkpoints/$CONFIG" \
  "$@"
