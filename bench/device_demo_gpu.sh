#!/usr/bin/env bash
# `agentrl-verl demo` on a GPU machine lent by the `device` tool: the embedded default settings, its warm-up and its
# RL phase on the card (warmup.device and rl.device auto: the gpu_tiny preset, the trainer and both hf rollout
# replicas on one GPU). That machine has no Docker, so `os` is left out as the demo does wherever no daemon answers;
# with bench/make_device_wheels.sh's wheels it has the alfworld package (before them, the tiny model's tokenizer was
# trained there without alfworld's text).
# Prepare once here:  bash ../shared/device/make_bundle.sh .verl_bundle && cp ../shared/device/install.sh .verl_bundle/
#   and the kg/webshop/alfworld wheels as .device_wheels.tar.xz (bash bench/make_device_wheels.sh)
# Run (device tool):  carry [".verl_bundle", ".device_wheels.tar.xz"], command "bash bench/device_demo_gpu.sh [--set
#                     KEY=VALUE ...]" (DEMO_TIMEOUT_S bounds the demo, default 540)
# Results go to $OUT: demo.log, summary.md/json, metrics.jsonl, learning_curve.png, verl.log, gpu.csv, and the
# demo's processes (bench.startup_timeline: when each started, its CPU) in timeline.json and at the end of demo.log.
# PYSPY=1: the demo runs under py-spy (its wheel in .verl_bundle: pip download py-spy --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 -d .verl_bundle), every process's sampled stacks in
# stacks.txt and their summary (bench.stack_profile) in stacks.md.
set -uo pipefail
OUT=${OUT:-/tmp/demo_gpu_out}
WORK=/tmp/demo_gpu
mkdir -p "$OUT" "$WORK"
WHEELS=.device_wheels.tar.xz DEVICE_GPU=1 source bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 2 > "$OUT/gpu.csv" &
SAMPLER=$!
PROFILER=()
[ "${PYSPY:-0}" = 1 ] && PROFILER=(/tmp/site/bin/py-spy record --subprocesses --nonblocking -r 25 --format raw
                                   -o "$OUT/stacks.txt" --)
timeout "${DEMO_TIMEOUT_S:-540}" "${PROFILER[@]}" python3 -m bench.startup_timeline --out "$OUT/timeline.json" -- \
  python3 -m agentrl_verl.tools.cli demo --output-dir "$WORK/demo" "$@" > "$OUT/demo.log" 2>&1
rc=$?
kill "$SAMPLER" 2>/dev/null
for name in summary.md summary.json metrics.jsonl learning_curve.png; do cp "$WORK/demo/$name" "$OUT/" 2>/dev/null; done
cp "$WORK/demo/verl.log" "$OUT/verl.log" 2>/dev/null
grep -E "RL step|warm-up|held-out|done in|device|ERROR|Error|Traceback" "$OUT/demo.log" | cut -c1-300 | tail -n 60
grep -E "^ +[0-9.]+ +[0-9.]+ +[0-9.]+  |exit_code=" "$OUT/demo.log" | cut -c1-140 | head -n 70
grep -E "hf rollout server|cuda|Error" "$OUT/verl.log" | cut -c1-300 | tail -n 20
if [ -f "$OUT/stacks.txt" ]; then
  { python3 -m bench.stack_profile "$OUT/stacks.txt" --top 30
    echo; echo "# Within update_actor"; python3 -m bench.stack_profile "$OUT/stacks.txt" --within update_actor --top 40
  } > "$OUT/stacks.md"
  head -c 6000 "$OUT/stacks.md"
fi
echo "demo exit code $rc"
exit "$rc"
