#!/usr/bin/env bash
# Our advantage estimator and agent loop in an existing verl pipeline, with Hydra overrides only: verl's own
# ppo_trainer config, plus the lines marked AgentRL. Installing this package is all the set-up (verl loads the
# plugin on import, which registers task_norm_grpo, agentrl_agent and agentrl_sync).
#   bash examples/verl_overrides.sh MODEL_PATH CONTROLLER_URL DATA_DIR [MORE_OVERRIDES ...]
# DATA_DIR: from `agentrl-verl make-data --controller CONTROLLER_URL --out DATA_DIR`.
set -euo pipefail
if [ $# -lt 3 ]; then sed -n 2,6p "$0"; exit 2; fi
MODEL=$1 URL=$2 DATA=$3
shift 3
exec python3 -m verl.trainer.main_ppo \
  actor_rollout_ref.model.path="$MODEL" \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/val.parquet" \
  algorithm.adv_estimator=task_norm_grpo `# AgentRL: GRPO + task advantage normalisation` \
  trainer.use_v1=true \
  trainer.v1.trainer_mode=agentrl_sync `# AgentRL: passes each sample's task to the estimator; per-task metrics` \
  actor_rollout_ref.rollout.agent.default_agent_loop=agentrl_agent `# AgentRL: multi-turn episodes vs the env` \
  actor_rollout_ref.rollout.multi_turn.format=hermes \
  +agentrl.env.url="$URL" `# AgentRL: the environment controller` \
  +agentrl.task_adv_norm=token \
  "$@"
