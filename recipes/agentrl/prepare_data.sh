#!/usr/bin/env bash
# Training and validation rows for the five AgentBench-FC tasks, read from the running controller (balanced by
# task, 10% of each task's indices held out for validation).
#   bash recipes/agentrl/prepare_data.sh CONTROLLER_URL DATA_DIR
set -euo pipefail
if [ $# -ne 2 ]; then sed -n 2,4p "$0"; exit 2; fi
exec agentrl-verl make-data --controller "$1" --out "$2" --val-fraction 0.1 --seed 0 \
  --task os-std --task dbbench-std --task kg-std --task alfworld-std --task webshop-std
