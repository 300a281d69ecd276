#!/usr/bin/env bash
# bench.ablation's runs on a GPU machine's CPU cores (the `device` tool), CPU only as on a laptop: every run at once,
# OMP_NUM_THREADS=2 per process. The start model: MODEL=DIR (a warm-up, carried), else the warm-up is built there
# first (on the GPU, `warmup.device: auto`) from BASE=DIR (a tiny model, carried) or, without BASE, from the tiny model
# built there (its tokenizer is trained on the text of the families installed there), and beside it, where an arm
# needs it, the fixed_pool arm's default fixed model (the same warm-up with warmup.seed 1); both come back in
# $OUT/warmup.tgz. FIXED=DIR: the fixed_pool arm's model (--fixed-model); with MODEL and no FIXED the bench builds its
# default itself, on the bench's 2 threads.
# Prepare once here:  bash ../shared/device/make_bundle.sh .verl_bundle && cp ../shared/device/install.sh .verl_bundle/
#                     and bash bench/make_device_wheels.sh (the env side's wheels, TextWorld and ALFWorld included, as
#                     .device_wheels.tar.xz). The carry is limited to 64 MiB with the checkout: leave the bundle's
#                     uvloop wheel out (Ray and the environment stack use it only where it is installed); a model
#                     may be carried with its weights as model.safetensors.xz where it fits.
# Run (device tool):  carry [".verl_bundle", ".device_wheels.tar.xz"], command "WHEELS=.device_wheels.tar.xz bash
#                     bench/device_ablation.sh --arms full sync --parallel 8 --pin --steps 12 --eval-size 32" (arguments
#                     go to bench.ablation; TOTAL_S bounds all but the collection; --pin: each run on 2 of the 16-core
#                     machine's CPUs).
# Small results (summary.md/json, ablation.png, each run's run.json, metrics and logs) go to $OUT as runs.tgz; models
# stay behind in /tmp/ablation. The same arguments on the same (still warm) machine resume a bench that was cut off.
set -uo pipefail
OUT=${OUT:-/tmp/ablation_out}  # at most 8 files come back: logs go into runs.tgz
WORK=/tmp/ablation
LOGS=$WORK/device
mkdir -p "$OUT" "$LOGS"
source bench/device_env.sh
for dir in "${BASE:-}" "${MODEL:-}" "${FIXED:-}"; do
  if [ -f "$dir/model.safetensors.xz" ]; then xz -d "$dir/model.safetensors.xz"; fi
done
# TQ_NUM_THREADS: TransferQueue's threads default to every core of the machine, in every run.
export OMP_NUM_THREADS=2 TQ_NUM_THREADS=2
collect() {
  # The background samplers end with the script: left running they hold the caller's output open until its limit.
  kill $(jobs -p) 2>/dev/null
  python3 -m bench.ablation --out "$WORK" --report > "$LOGS/report.txt" 2>&1
  cp "$WORK"/summary.* "$WORK"/ablation.png "$OUT"/ 2>/dev/null
  (cd "$WORK" && find . \( -name run.json -o -name metrics.jsonl -o -name bench.log -o -path './device/*' \) \
     -not -path '*/checkpoints/*' -print0 | tar czf "$OUT/runs.tgz" --null -T -)
  # The first error of a failed run, if any.
  grep -l -m1 "Error" "$WORK"/*/bench.log "$WORK"/*/*/bench.log 2>/dev/null | head -2 | while read -r log; do
    echo "== $log"; grep -m1 -B5 -A25 "Error" "$log" | cut -c1-300; done
  # Each run's last training step and its timing (sizes the next call).
  for log in "$WORK"/*/seed_*/bench.log; do [ -f "$log" ] && echo "$log: $(grep "RL step" "$log" | tail -1 | cut -c1-160)"; done
  tail -3 "$LOGS/report.txt"
}
trap collect EXIT
echo "cpus $(nproc --all)"
# Each 30 s: the load, and the runs' records so far (a call cut off before collect() still brings back what ended).
(while uptime; do
   (cd "$WORK" && find . -name run.json -print0 | tar czf "$OUT/partial.tgz.tmp" --null -T - \
      && mv "$OUT/partial.tgz.tmp" "$OUT/partial.tgz") 2>/dev/null
   sleep 30; done > "$LOGS/load.txt") &
# The bundle is installed without bytecode: compiled once here, not by every process of 19 runs starting at once.
began=$SECONDS
python3 -m compileall -q -j 0 /tmp/site "$PWD/agentrl_verl" "$PWD/env_adapters" "$PWD/bench" > /dev/null 2>&1
echo "bytecode: $((SECONDS - began)) s"
# The bench's own parsing of its arguments: the families (--families) and whether an arm needs the fixed model.
read -r FAMILIES NEEDS_FIXED < <(python3 -c "import sys; from bench.ablation import parse_args, uses_fixed_model; \
args = parse_args(sys.argv[1:]); print(repr(args.families).replace(' ', ''), int(uses_fixed_model(args.arms)))" "$@")
[ -n "${NEEDS_FIXED:-}" ] || { echo "bench.ablation refused the arguments: $*"; exit 2; }
warm_up() {  # $1: the warm-up's settings (a Python expression over bench.ablation), $2: its log's name
  OMP_NUM_THREADS=16 python3 -c "import sys; from pathlib import Path; from bench.ablation import \
warmed_up_model, workload, fixed_warmup; print(warmed_up_model($1, Path(sys.argv[1]) if sys.argv[1] else None))" \
    "${BASE:-}" 2> "$LOGS/$2.log" | tail -1
}
if [ -z "${MODEL:-}" ]; then
  began=$SECONDS
  # Both at once, the fixed one only where an arm needs it and no FIXED is carried.
  warm_up "workload($FAMILIES)" warmup > "$LOGS/warmup.path" &
  builds=($!)
  if [ "$NEEDS_FIXED" = 1 ] && [ -z "${FIXED:-}" ]; then
    warm_up "fixed_warmup(workload($FAMILIES))" warmup_fixed > "$LOGS/warmup_fixed.path" &
    builds+=($!)
  fi
  wait "${builds[@]}"  # not the load sampler
  MODEL=$(cat "$LOGS/warmup.path")
  [ "$NEEDS_FIXED" = 1 ] && FIXED=${FIXED:-$(cat "$LOGS/warmup_fixed.path")}
  for dir in "$MODEL" ${FIXED:-}; do
    [ -f "$dir/config.json" ] || { echo "warm-up failed"; tail -20 "$LOGS"/warmup*.log; exit 1; }
    echo "warm-up: $dir: $(cut -c1-200 "$dir/warmup.json")"
  done
  echo "warm-ups: $((SECONDS - began)) s"
  tar czf "$OUT/warmup.tgz" -C "$(dirname "$MODEL")" "$(basename "$MODEL")" \
    ${FIXED:+-C "$(dirname "$FIXED")" "$(basename "$FIXED")"}
fi
MODEL_ARGS=()
[ -z "${MODEL:-}" ] || MODEL_ARGS+=(--model "$MODEL")
[ -z "${FIXED:-}" ] || MODEL_ARGS+=(--fixed-model "$FIXED")
# The bench gets what is left of TOTAL_S (the call's limit less the collection) after the warm-up.
timeout --kill-after=45 "$(( ${TOTAL_S:-520} - SECONDS ))" python3 -m bench.ablation --out "$WORK" "${MODEL_ARGS[@]}" "$@" 2>&1 \
  | tee "$LOGS/bench.txt" | grep -E "started|done|failed|Error|error" | cut -c1-250
echo "bench rc=${PIPESTATUS[0]}"
