#!/usr/bin/env bash
# The hf rollout backend on a GPU machine without vLLM/SGLang (the `device` tool), in one command:
#   1. bench.hf_rollout with random weights (bf16) of Qwen2.5-0.5B's shape at 1, 8 and 32 concurrent requests and of
#      SmolLM2-135M's at 1, 8, 32, 64 and 128 (BENCH_ONLY=1: this stage alone);
#   2. the hf server as a Ray actor placed on the GPU, loaded through the verl plugin (platform must be nvidia);
#   3. verl's main_ppo (GRPO, 2 steps) with rollout.name=hf and the cpu_tiny preset, on the GPU.
# Prepare once here:  bash ../shared/device/make_bundle.sh .verl_bundle && cp ../shared/device/install.sh .verl_bundle/
# (stages 2-3 need the environment side's wheels in the bundle: httptools, uvloop, orjson and docker for the
# environment client the plugin imports, pyoxigraph for the kg episodes the tiny model's tokenizer is trained on).
# Run (device tool):  carry [".verl_bundle"], command "bash bench/device_hf_rollout.sh"
# Results go to $OUT (bench.txt, bench_smollm2.txt, server.txt, main_ppo.txt).
set -uo pipefail
OUT=${OUT:-/tmp/hf_rollout_out}
mkdir -p "$OUT"
bash .verl_bundle/install.sh .verl_bundle /tmp/site >/dev/null || { echo "bundle install failed"; exit 1; }
# The repo is not pip-installed there, so the plugin is loaded by module name instead of its entry point.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled \
       VERL_USE_EXTERNAL_MODULES=agentrl_verl.plugin AGENTRL_CACHE_DIR=/tmp/agentrl_cache
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== 1. bench"
timeout 300 python3 -m bench.hf_rollout --model qwen2-0.5b --concurrency 1 8 32 --prompt-len 128 --new-tokens 128 --repeats 3 \
  2>&1 | tee "$OUT/bench.txt"
timeout 300 python3 -m bench.hf_rollout --model smollm2-135m --concurrency 1 8 32 64 128 --prompt-len 128 \
  --new-tokens 128 --repeats 2 2>&1 | tee "$OUT/bench_smollm2.txt"
[ "${BENCH_ONLY:-0}" = 1 ] && exit 0

python3 -c "import httptools, uvloop, orjson, docker, pyoxigraph" ||
  { echo "stages 2-3 skipped: the bundle lacks the environment side's wheels (see the top of this script)"; exit 1; }

echo "== 2. server actor on the GPU"
timeout 120 python3 - <<'EOF' 2>&1 | grep -v Warning | tee "$OUT/server.txt"
import asyncio, ray, verl
from hydra import compose, initialize_config_dir
from verl.plugin.platform import get_platform
from verl.workers.rollout.replica import RolloutMode
from agentrl_verl.presets import CONFIG_DIR
from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.backends.hf_rollout.server import HFRolloutServer
print("platform", get_platform().device_name)
path = build_tiny_model()
with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
    cfg = compose(config_name="cpu_tiny", overrides=[f"actor_rollout_ref.model.path={path}",
                                                     "actor_rollout_ref.rollout.dtype=bfloat16"])
ray.init(num_gpus=1, include_dashboard=False)
gpu = ray.get(ray.remote(num_gpus=1)(lambda: ray.get_runtime_context().get_accelerator_ids()["GPU"][0]).remote())
server = ray.remote(HFRolloutServer).options(
    runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}).remote(
    cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model, RolloutMode.HYBRID, 0, visible_devices=str(gpu))
print("server device", ray.get(server.get_device.remote()))
async def main():
    outs = await asyncio.gather(*[server.generate.remote(prompt_ids=[5, 6, 7 + i], request_id=str(i),
                                  sampling_params={"temperature": 1.0, "logprobs": True, "max_tokens": 16})
                                  for i in range(8)])
    print("generated", [len(o.token_ids) for o in outs], "stop", {o.stop_reason for o in outs})
asyncio.run(main())
EOF

echo "== 3. main_ppo GRPO with the hf rollout on the GPU"
cd /tmp && python3 - <<EOF
import importlib.util
spec = importlib.util.spec_from_file_location("arith", "$OLDPWD/tests/agentrl_verl/e2e/arith_data.py")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
m.make_parquet("/tmp/train.parquet", 16); m.make_parquet("/tmp/val.parquet", 4, seed=1)
EOF
MODEL=$(python3 -c "from agentrl_verl.models.tiny import build_tiny_model; print(build_tiny_model())")
timeout 300 python3 -m verl.trainer.main_ppo --config-path "$OLDPWD/agentrl_verl/presets" --config-name cpu_tiny \
  actor_rollout_ref.model.path="$MODEL" data.train_files=/tmp/train.parquet data.val_files=/tmp/val.parquet \
  reward.custom_reward_function.path="$OLDPWD/tests/agentrl_verl/e2e/arith_data.py" \
  ray_kwargs.ray_init.num_cpus=16 > "$OUT/main_ppo.txt" 2>&1
echo "main_ppo rc=$?"
grep -o "step:[0-9]* .*" "$OUT/main_ppo.txt" | tr ' ' '\n' | grep -E "^step:|rollout_probs_diff_max|timing_s/step|timing_s/gen|actor/grad_norm" || tail -40 "$OUT/main_ppo.txt"
grep -m3 -E "hf rollout server|platform" "$OUT/main_ppo.txt"
