#!/usr/bin/env bash
# bench.async_vs_sync's paired runs on a GPU machine's CPU cores (the `device` tool), CPU only as on a laptop, with
# OMP_NUM_THREADS=2 per process: with --parallel 5 --arms-at-once --pin each run has 3 cores of its own on the 32-core
# machine, 6 on the 64-core one; on the 16-core one, unpinned, ten runs share them.
# Prepare once here:  bash ../shared/device/make_bundle.sh .verl_bundle && cp ../shared/device/install.sh .verl_bundle/
# Run (device tool):  carry [".verl_bundle", DIR], command "bash bench/device_async_vs_sync.sh --seeds 0 1 2 3 4
#                     --parallel 5 --steps 24 --batch 4 --n 8 --arms-at-once --pin --eval-size 400 --model DIR/COLD"
#                     (arguments go to bench.async_vs_sync; --model takes a carried warm-up model as is; BENCH_TIMEOUT_S
#                     bounds the whole bench: those 24 steps took 8.1 min of a 10-minute command on 32 cores).
# Small results (summary.md/json, pairs.png, each seed's pair.json, start.json, metrics and logs) go to $OUT as
# runs.tgz; models stay behind in /tmp/async_vs_sync. A run cut off by the call's limit resumes with the same
# arguments: on the same machine (still warm) as it is; on a fresh one from RESUME=runs.tgz (carried), which restores
# the pairs' records (evaluated pairs are kept, the others run again: their models are gone).
set -uo pipefail
OUT=${OUT:-/tmp/async_vs_sync_out}
WORK=/tmp/async_vs_sync
mkdir -p "$OUT" "$WORK"
if [ -n "${RESUME:-}" ] && [ -z "$(ls -A "$WORK")" ]; then
  tar xzf "$RESUME" -C "$WORK" && echo "resumed from $RESUME: $(ls "$WORK")"
fi
source bench/device_env.sh
export OMP_NUM_THREADS=2
collect() {
  # The background samplers end with the script: left running they hold the caller's output open until its limit.
  kill $(jobs -p) 2>/dev/null
  cp "$WORK"/summary.* "$WORK"/pairs.png "$OUT"/ 2>/dev/null
  (cd "$WORK" && find . \( -name pair.json -o -name start.json -o -name '*.jsonl' -o -name '*.log' \
                           -o -name proc_stat.txt \) \
     -not -path '*/ckpt_*' -print0 \
     | tar czf "$OUT/runs.tgz" --null -T -)
  tar czf "$OUT/warmup.tgz" -C "$AGENTRL_CACHE_DIR" async_vs_sync 2>/dev/null
  python3 - "$WORK" > "$OUT/cpu_busy.txt" 2>&1 <<'PY'
import glob, re, sys
samples = []  # per 10 s: cpu -> (busy, total) counters; idle and iowait are not busy
for line in open(f"{sys.argv[1]}/proc_stat.txt"):
    name, *fields = line.split()
    if name == "t":
        samples.append({})
    elif samples:
        values = list(map(int, fields))
        samples[-1][name] = (sum(values) - values[3] - values[4], sum(values))
samples = [sample for sample in samples if len(sample) == len(samples[0])]
def busy(cpus):  # CPUs busy on average over the run, and in its busiest 10 s
    def share(a, b):
        return sum((b[c][0] - a[c][0]) / max(b[c][1] - a[c][1], 1) for c in cpus)
    return share(samples[0], samples[-1]), max(share(a, b) for a, b in zip(samples, samples[1:]))
every = sorted(samples[0], key=lambda name: int(name[3:]))
print("CPUs busy (mean over the run, busiest 10 s) of all %d: %.1f, %.1f" % (len(every), *busy(every)))
# The CPUs each run was pinned to (--pin), as the bench logged them.
pattern = re.compile(r"seed (\d+): (\w+) run .* on CPUs ([\d,-]+)")
for log in sorted(glob.glob(f"{sys.argv[1]}/**/bench.log", recursive=True)):
    for match in pattern.finditer(open(log).read()):
        cpus = [f"cpu{i}" for part in match[3].split(",")
                for i in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
        print("seed %s %s on CPUs %s: %.1f, %.1f of %d" % (match[1], match[2], match[3], *busy(cpus), len(cpus)))
PY
  # The first error of a failed run, if any.
  grep -l -m1 "Error" "$WORK"/*.log "$WORK"/seed_*/*.log 2>/dev/null | head -2 | while read -r log; do
    echo "== $log"; grep -m1 -B5 -A25 "Error" "$log" | cut -c1-300; done
}
trap collect EXIT
echo "cpus $(nproc --all)"
# The load while it runs (are cores left idle? --arms-at-once assumes so), once a minute, and every CPU's counters
# every 10 s, summarised on exit into cpu_busy.txt: CPUs busy, on average and in the busiest 10 s, of the machine and
# of each pinned run's share.
(while uptime; do sleep 60; done > "$OUT/load.txt") &
(while echo "t $(date +%s)" && grep '^cpu[0-9]' /proc/stat; do sleep 10; done > "$WORK/proc_stat.txt") &
timeout --kill-after=10 "${BENCH_TIMEOUT_S:-560}" python3 -m bench.async_vs_sync --out "$WORK" "$@" 2>&1 \
  | tee "$OUT/bench.txt" | grep -E "warm-up|seed [0-9]+: |step [0-9]+/|speedup|held.out|Error|error" | cut -c1-300
echo "bench rc=${PIPESTATUS[0]}"
