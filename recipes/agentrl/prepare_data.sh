#!/usr/bin/env bash
# Training and validation rows for the five AgentBench-FC tasks, read from the running controller (balanced by
# task, 10% of each task's indices held out for validation). The token is read from AGENTRL_ENV_TOKEN_FILE (default
# ~/.agentrl/env.token, what `agentrl-env up` wrote for the recipe's stack).
#   bash recipes/agentrl/prepare_data.sh CONTROLLER_URL DATA_DIR
set -euo pipefail
if [ $# -ne 2 ]; then sed -n 2,5p "$0"; exit 2; fi
exec agentrl-verl make-data --controller "$1" --out "$2" --val-fraction 0.1 --seed 0 \
  --token-file "${AGENTRL_ENV_TOKEN_FILE:-$HOME/.agentrl/env.token}" \
  --task os-std --task dbbench-std --task kg-std --task alfworld-std --task webshop-std
