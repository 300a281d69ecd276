#!/usr/bin/env bash
# bench.hf_weight_update on a GPU machine lent by the `device` tool: one hf weight update of a random Qwen2 of
# Qwen2.5-1.5B's shape (and 0.5B's), through Ray's object store (the old path) and by CUDA IPC, in the same run.
# Prepare once here:  bash ../shared/device/make_bundle.sh .verl_bundle && cp ../shared/device/install.sh .verl_bundle/
#   and the tiny model's tokenizer (the device cannot build it without the environment side's wheels):
#   cp -r "$(.venv/bin/python -c 'from agentrl_verl.models.tiny import build_tiny_model; print(build_tiny_model())')" .bench_tokenizer
# Run (device tool):  carry [".verl_bundle", ".bench_tokenizer"], command "bash bench/device_hf_weight_update.sh"
# Results go to $OUT (weight_update_<shape>.txt).
set -uo pipefail
OUT=${OUT:-/tmp/hf_weight_update_out}
mkdir -p "$OUT"
DEVICE_GPU=1 source bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
for shape in qwen2-1.5b qwen2-0.5b; do
  echo "== $shape"
  timeout 240 python3 -m bench.hf_weight_update --shape "$shape" --tokenizer .bench_tokenizer --repeats 3 2>&1 \
    | grep -v -E "Warning|warn\(" | tee "$OUT/weight_update_$shape.txt"
done
