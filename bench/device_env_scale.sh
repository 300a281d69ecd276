#!/usr/bin/env bash
# bench.env_scale on the GPU machine's 16 CPU cores (the `device` tool): the environment stack's throughput with
# its workers on 1, 2 and 3 raylets of one local Ray cluster, where the cores do not bound it as on 2.
# Prepare once here:  bash ../shared/device/make_bundle.sh .verl_bundle && cp ../shared/device/install.sh .verl_bundle/
# Run (device tool):  carry [".verl_bundle"], command "bash bench/device_env_scale.sh" (TASK=webshop ROUNDS=1: a family whose
#                     steps cost the worker; carry .device_wheels.tar.xz too, from bench/make_device_wheels.sh)
# Results go to $OUT/env_scale.txt.
set -uo pipefail
OUT=${OUT:-/tmp/env_scale_out}
mkdir -p "$OUT"
TASK=${TASK:-calc} ROUNDS=${ROUNDS:-4}
[ "$TASK" = calc ] || WHEELS=.device_wheels.tar.xz
source bench/device_env.sh
nproc | sed 's/^/cores: /' | tee "$OUT/env_scale.txt"
for workers in 1 2; do
  echo "== workers per node: $workers" | tee -a "$OUT/env_scale.txt"
  timeout 280 python3 -m bench.env_scale --task "$TASK" --rounds "$ROUNDS" --duration 10 --clients 4 --concurrency 32 --workers-per-node "$workers" \
    2>&1 | grep -E "^\[env_scale\]|^task=|Error|error" | tee -a "$OUT/env_scale.txt"
done
