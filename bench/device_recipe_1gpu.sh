#!/usr/bin/env bash
# The single-GPU recipe by its own entry point on a GPU machine lent by the `device` tool: `recipes/agentrl/run.sh
# 1gpu` with a random model of Qwen2.5-0.5B's shape (the tiny tokenizer's 2048-token vocabulary), 3 steps, against
# the recipe's environment stack started there: its YAML at smoke size on loopback with a token (the recipe's path:
# run.sh reads it from AGENTRL_ENV_TOKEN_FILE), all five families where a Docker daemon answers and MariaDB is
# installed; the lent machine has neither, so there `os` is left out and `db` runs on SQLite
# (bench.gpu_recipe.smoke_stack).
# Prepare once here:  bash ../shared/device/make_bundle.sh .verl_bundle && cp ../shared/device/install.sh .verl_bundle/
#   the tiny model's tokenizer:
#   cp -r "$(.venv/bin/python -c 'from agentrl_verl.models.tiny import build_tiny_model; print(build_tiny_model())')" .bench_tokenizer
#   and the kg/webshop/alfworld wheels: bash bench/make_device_wheels.sh
# Run (device tool):  carry [".verl_bundle", ".bench_tokenizer", ".device_wheels.tar.xz"],
#                     command "bash bench/device_recipe_1gpu.sh" (RUN_TIMEOUT_S bounds the training run, default 480)
# Results go to $OUT: metrics.jsonl (verl's file logger), run.log, env.log, gpu.csv, report.md (python -m bench.gpu_recipe).
set -uo pipefail
OUT=${OUT:-/tmp/recipe_1gpu_out}
WORK=/tmp/recipe_1gpu
mkdir -p "$OUT" "$WORK/bin"
WHEELS=.device_wheels.tar.xz DEVICE_GPU=1 source bench/device_env.sh
export OMP_NUM_THREADS=8 RAY_worker_niceness=0 JAX_PLATFORMS=cpu AGENTRL_ENV_TOKEN_FILE=$WORK/env.token
# The repo is not pip-installed there: the console scripts the recipe calls, by module.
printf '#!/bin/sh\nexec python3 -m env_adapters.cli "$@"\n' > "$WORK/bin/agentrl-env"
printf '#!/bin/sh\nexec python3 -m agentrl_verl.tools.cli "$@"\n' > "$WORK/bin/agentrl-verl"
chmod +x "$WORK/bin/"*
export PATH=$WORK/bin:$PATH
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

TASKS=$(python3 -c "from bench.gpu_recipe import write_smoke_stack
print(' '.join(write_smoke_stack('$WORK/stack.yaml', '$AGENTRL_ENV_TOKEN_FILE')))") || { echo "no stack"; exit 1; }
echo "families: $TASKS"
# os's image, built once from Debian's packages (cached by content hash), before the stack's start-up clock runs.
[[ " $TASKS " == *" os-std "* ]] && { agentrl-env build-images os-default || { echo "os image failed"; exit 1; }; }
agentrl-env up "$WORK/stack.yaml" --startup-timeout 300 > "$OUT/env.log" 2>&1 &
ENV_PID=$!
finish() {
  kill $(jobs -p) 2>/dev/null
  pkill -f "env_adapters" 2>/dev/null
  python3 -m bench.gpu_recipe "$OUT" > "$OUT/report.md" 2>&1
  cat "$OUT/report.md"
  grep -m1 -B5 -A30 "Error" "$OUT/run.log" 2>/dev/null | cut -c1-300
}
trap finish EXIT
URL=http://127.0.0.1:5020
for _ in $(seq 150); do
  grep -q "controller URL:" "$OUT/env.log" 2>/dev/null && break
  kill -0 $ENV_PID 2>/dev/null || { echo "the stack exited"; tail -30 "$OUT/env.log"; exit 1; }
  sleep 2
done
grep "environment stack up" "$OUT/env.log" || { echo "the stack did not come up"; tail -30 "$OUT/env.log"; exit 1; }
agentrl-verl make-data --controller "$URL" --token-file "$AGENTRL_ENV_TOKEN_FILE" --out "$WORK/data" \
  --val-fraction 0.1 --seed 0 $(printf -- "--task %s " $TASKS) 2>&1 | tail -3
python3 -c "
from pathlib import Path
from bench.hf_weight_update import build_model_dir
build_model_dir('qwen2-0.5b', Path('.bench_tokenizer'), Path('$WORK/model'))"

(while true; do nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits; sleep 2; done) \
  > "$OUT/gpu.csv" &
# Smoke sizes (16 prompts x 4 samples, 3 turns of 128 tokens: a random model's actions are invalid and an episode
# would otherwise run to the task's 15-20 rounds; no validation); the image has no flash-attn (sdpa
# attention, padded batches) and no wandb.
VERL_FILE_LOGGER_PATH=$OUT/metrics.jsonl timeout "${RUN_TIMEOUT_S:-480}" \
  bash recipes/agentrl/run.sh 1gpu "$WORK/model" "$URL" "$WORK/data" \
  trainer.total_training_steps=3 data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=4 \
  actor_rollout_ref.rollout.n=4 agentrl.agent.max_turns=3 agentrl.agent.max_new_tokens=128 \
  trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 'trainer.logger=[console,file]' \
  actor_rollout_ref.model.use_remove_padding=false +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
  > "$OUT/run.log" 2>&1
echo "run.sh exited with $?"
