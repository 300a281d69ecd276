#!/usr/bin/env bash
# Splits SmolLM2-135M-Instruct's GGUF (98 MB; `agentrl-verl build-model smollm2` fetched it into the cache) into three
# parts, .gguf_part1/ .gguf_part2/ .gguf_part3/ (git-ignored), for the lent GPU machine: a call carries 64 MiB at
# most, the repository ~10 of them and the verl bundle 47, so the file and the environment side's wheels
# (.device_wheels.tar.xz, with the first part) travel in three calls of their own (bench/device_gguf.sh) before the
# run that needs them, on the same warm machine.
#   bash bench/make_device_gguf.sh
set -euo pipefail
cd "$(dirname "$0")/.."
gguf=$(.venv/bin/python -c "from agentrl_verl.models.cache import default_cache_dir; from agentrl_verl.models.smollm2 \
import fetch_gguf; print(fetch_gguf(default_cache_dir()))")
rm -rf .gguf_part1 .gguf_part2 .gguf_part3
mkdir -p .gguf_part1 .gguf_part2 .gguf_part3
split -n 3 -d -a 1 "$gguf" .gguf_split_
for i in 1 2 3; do mv ".gguf_split_$((i - 1))" ".gguf_part$i/part"; done
ls -l .gguf_part*/part
