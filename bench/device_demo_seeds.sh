#!/usr/bin/env bash
# bench.demo_seeds on a GPU machine's CPU cores (the `device` tool), CPU only as on a laptop (the GPU is unused):
# several settings at once, each on an equal share of the CPUs, its runs pinned inside it (a run takes as many
# threads as it has CPUs). Arguments: groups separated by `---`, each a name and bench.demo_seeds' arguments (no
# --out: a group's runs go to /tmp/demo_seeds/NAME), e.g.
#   lr1e-4 --seeds 4 5 6 7 8 9 --parallel 6 --pin --set rl.overrides.5=actor_rollout_ref.actor.optim.lr=1.0e-4 ---
#   steps26 --seeds 0 1 2 3 4 5 --parallel 6 --pin --set rl.steps=26 --set rl.overrides.5=...
# Prepare once here:  the bundle (see bench/device_env.sh) and WHEELS=FILE.tar.xz, the unpacked cp312 wheels of the
#                     multi-task families: pyoxigraph (kg); nltk, thefuzz, rapidfuzz (webshop); textworld,
#                     alfworld, fast_downward (its libdownward.so stripped of debug info: 33 MB -> 1.3 MB; textworld's
#                     inform7 folder left out, the PDDL games do not use it), jericho, tatsu, mementos, hashids, nltk,
#                     regex, networkx, prompt_toolkit, wcwidth, termcolor and defusedxml (alfworld); 13 MB with xz.
# Run (device tool):  carry [".verl_bundle", WHEELS], command "WHEELS=... bash bench/device_demo_seeds.sh GROUPS".
#                     TOTAL_S (default 540) bounds the runs; what finished by then is reported. A whole demo run
#                     must fit: with 12 runs on the 64-core machine (5 cores each), the multi-task preset does not
#                     fit a 10-minute call (its 400 warm-up steps on the CPU took 330 s and its first evaluation 55 s;
#                     with the warm-up on the GPU no run had finished RL at 560 s either). At plumbing size (40
#                     warm-up steps, 16 demonstrations and 4 held-out indices a family, 2 RL steps) two runs on the
#                     16-CPU one-GPU machine took 209 and 216 s: warm-up on the GPU 12 s, RL 176-181 s (its first
#                     step about 160 s after launch, mostly Ray's and verl's start-up).
# Each group's summary.md/json, and each run's summary, metrics, trajectories and logs, come back in $OUT/runs.tgz;
# every 30 s the runs' summaries and the tails of their logs so far go to $OUT/partial.tgz (a call cut off before
# the end still brings them back).
set -uo pipefail
OUT=${OUT:-/tmp/demo_seeds_out}
WORK=/tmp/demo_seeds
mkdir -p "$OUT" "$WORK"
source bench/device_env.sh
groups=() current=""
for arg in "$@"; do
  if [ "$arg" = "---" ]; then groups+=("$current"); current=""; else current+="${current:+ }$arg"; fi
done
[ -n "$current" ] && groups+=("$current")
[ ${#groups[@]} -gt 0 ] || { echo "usage: device_demo_seeds.sh NAME ARGS... [--- NAME ARGS...]"; exit 2; }
collect() {
  # The background sampler ends with the script: left running it holds the caller's output open until its limit.
  kill $(jobs -p) 2>/dev/null
  for group in "${groups[@]}"; do
    read -r name args <<< "$group"
    # shellcheck disable=SC2086  # a group's arguments are words
    python3 -m bench.demo_seeds --out "$WORK/$name" $args --report 2>&1 | tail -1 | sed "s/^/$name: /"
  done
  (cd "$WORK" && find . -maxdepth 3 \( -name 'summary.*' -o -name metrics.jsonl -o -name trajectories.jsonl \
     -o -name demo.log -o -name verl.log -o -name learning_curve.png \) -print0 | tar czf "$OUT/runs.tgz" --null -T -)
  # The first error of a failed run, if any.
  grep -l -m1 "Error" "$WORK"/*/seed_*/demo.log 2>/dev/null | head -2 | while read -r log; do
    echo "== $log"; grep -m1 -B5 -A25 "Error" "$log" | cut -c1-300; done
}
trap collect EXIT
echo "cpus $(nproc --all)"
(while uptime; do
   (cd "$WORK" && find . -maxdepth 3 -name 'summary.*' -print0 | tar czf "$OUT/partial.tgz.tmp" --null -T - \
      && for log in */seed_*/demo.log; do tail -5 "$log" | cut -c1-200 | sed "s|^|$log: |"; done \
      > "$OUT/progress.txt" && mv "$OUT/partial.tgz.tmp" "$OUT/partial.tgz") 2>/dev/null
   sleep 30; done > "$OUT/load.txt") &
# The bundle is installed without bytecode: compiled once here, not by every process of the runs starting at once.
python3 -m compileall -q -j 0 /tmp/site "$PWD/agentrl_verl" "$PWD/env_adapters" "$PWD/bench" > /dev/null 2>&1
cpus=($(python3 -c "import os; print(*sorted(os.sched_getaffinity(0)))"))
share=$(( ${#cpus[@]} / ${#groups[@]} ))
pids=()
for i in "${!groups[@]}"; do
  read -r name args <<< "${groups[$i]}"
  mine=$(IFS=,; echo "${cpus[*]:$(( i * share )):$share}")
  echo "$name on CPUs ${cpus[$(( i * share ))]}-${cpus[$(( i * share + share - 1 ))]}: $args"
  # shellcheck disable=SC2086
  # SIGTERM stops each demo's stack and verl run; SIGKILL 20 s later leaves time for collect() inside the call.
  taskset -c "$mine" timeout --kill-after=20 "$(( ${TOTAL_S:-540} - SECONDS ))" \
    python3 -m bench.demo_seeds --out "$WORK/$name" $args > "$WORK/$name.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; echo "${groups[$i]%% *} rc=$?"
done
