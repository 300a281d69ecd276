#!/usr/bin/env bash
# `agentrl-verl demo` on a GPU machine lent by the `device` tool: the embedded default settings (or `--model smollm2`,
# the real model's), its warm-up and its RL phase on the card (warmup.device and rl.device auto: the gpu_tiny preset,
# the trainer and both hf rollout replicas on one GPU). That machine has no Docker, so `os` is left out as the demo
# does wherever no daemon answers; with bench/make_device_wheels.sh's wheels it has the alfworld package and gguf.
# Prepare once here:  bash ../shared/device/make_bundle.sh .verl_bundle && cp ../shared/device/install.sh .verl_bundle/
#   and the environment side's wheels as .device_wheels.tar.xz (bash bench/make_device_wheels.sh); for
#   --model smollm2 also the GGUF and the wheels, in three earlier calls on the same warm machine (bench/device_gguf.sh).
# Run (device tool):  carry [".verl_bundle", ".device_wheels.tar.xz"] (after bench/device_gguf.sh: ".verl_bundle"
#                     alone), command "bash bench/device_demo_gpu.sh [--model smollm2] [--set KEY=VALUE ...]"
#                     (DEMO_TIMEOUT_S bounds the demo, default 540)
# A demo longer than one call's 10 minutes: DEMO_DETACH=1 starts it in a session of its own, which outlives the call
# while the machine is warm, and waits DEMO_WAIT_S (default 540) for it; the next call, right after, with
# DEMO_ATTACH=1 (no carry needed: the bundle is installed) waits again and collects. Either way what is there so far
# comes back, and the last line says whether the demo is still running.
# Results go to $OUT: demo.log, summary.md/json, metrics.jsonl, learning_curve.png, verl.log, gpu.csv, and the
# demo's processes (bench.startup_timeline: when each started, its CPU) in timeline.json and at the end of demo.log.
# PYSPY=1: the demo runs under py-spy (its wheel in .verl_bundle: pip download py-spy --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 -d .verl_bundle), every process's sampled stacks in
# stacks.txt and their summary (bench.stack_profile) in stacks.md.
set -uo pipefail
OUT=${OUT:-/tmp/demo_gpu_out}
WORK=/tmp/demo_gpu
RUN=$WORK/run  # the demo's own logs and status, kept across calls
mkdir -p "$OUT" "$RUN"
if [ "${DEMO_ATTACH:-0}" = 1 ]; then
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
else
  # The wheels come carried, or ahead of the run with the GGUF (bench/device_gguf.sh), when the carry is full.
  wheels=.device_wheels.tar.xz
  [ -f "$wheels" ] || wheels=/tmp/agentrl_gguf/device_wheels.tar.xz
  WHEELS=$wheels DEVICE_GPU=1 source bench/device_env.sh
  if ls /tmp/agentrl_gguf/*.gguf >/dev/null 2>&1; then  # carried by bench/device_gguf.sh
    mkdir -p "$AGENTRL_CACHE_DIR/gguf" && cp /tmp/agentrl_gguf/*.gguf "$AGENTRL_CACHE_DIR/gguf/"
  fi
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$RUN/gpu.txt"
  rm -f "$RUN/rc" "$RUN/demo.log"
  PROFILER=()
  [ "${PYSPY:-0}" = 1 ] && PROFILER=(/tmp/site/bin/py-spy record --subprocesses --nonblocking -r 25 --format raw
                                     -o "$RUN/stacks.txt" --)
  # In a session of its own (setsid): it outlives this call, and the sampler with it.
  setsid bash -c 'nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 2 > "$0/gpu.csv" &
    sampler=$!
    timeout "$1" "${@:2}" > "$0/demo.log" 2>&1
    echo $? > "$0/rc"
    kill $sampler' "$RUN" "${DEMO_TIMEOUT_S:-540}" \
    "${PROFILER[@]}" python3 -m bench.startup_timeline --out "$RUN/timeline.json" -- \
    python3 -m agentrl_verl.tools.cli demo --output-dir "$WORK/demo" "$@" < /dev/null &
fi
# Wait for the demo (the whole of it unless detached), then bring back what there is.
waited=0
while [ ! -f "$RUN/rc" ]; do
  if [ "${DEMO_DETACH:-0}" = 1 ] || [ "${DEMO_ATTACH:-0}" = 1 ]; then
    [ "$waited" -ge "${DEMO_WAIT_S:-540}" ] && break
  fi
  sleep 5
  waited=$((waited + 5))
done
cp "$RUN"/gpu.txt "$RUN"/gpu.csv "$RUN"/demo.log "$RUN"/timeline.json "$OUT/" 2>/dev/null
for name in summary.md summary.json metrics.jsonl learning_curve.png verl.log; do
  cp "$WORK/demo/$name" "$OUT/" 2>/dev/null
done
grep -E "RL step|warm-up|held-out|done in|device|smoke|ERROR|Error|Traceback" "$OUT/demo.log" | cut -c1-300 | tail -n 60
grep -E "^ +[0-9.]+ +[0-9.]+ +[0-9.]+  |exit_code=" "$OUT/demo.log" | cut -c1-140 | head -n 70
grep -E "hf rollout server|cuda|Error" "$OUT/verl.log" 2>/dev/null | cut -c1-300 | tail -n 20
if [ -f "$RUN/stacks.txt" ] && [ -f "$RUN/rc" ]; then
  { python3 -m bench.stack_profile "$RUN/stacks.txt" --top 30
    echo; echo "# Within update_actor"; python3 -m bench.stack_profile "$RUN/stacks.txt" --within update_actor --top 40
  } > "$OUT/stacks.md"
  head -c 6000 "$OUT/stacks.md"
fi
if [ ! -f "$RUN/rc" ]; then
  echo "demo still running after ${waited} s of this call: call again at once with DEMO_ATTACH=1"
  exit 0
fi
rc=$(cat "$RUN/rc")
echo "demo exit code $rc"
exit "$rc"
