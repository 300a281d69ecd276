#!/usr/bin/env bash
# Splits SmolLM2-135M-Instruct's GGUF (98 MB; `agentrl-verl build-model smollm2` fetched it into the cache) into two
# halves, .gguf_part1/ and .gguf_part2/ (git-ignored), for the lent GPU machine: a call carries 64 MiB at most, so
# each half travels in a call of its own (bench/device_gguf.sh), and the run that needs the file comes after them on
# the same warm machine.
#   bash bench/make_device_gguf.sh
set -euo pipefail
cd "$(dirname "$0")/.."
gguf=$(.venv/bin/python -c "from agentrl_verl.models.cache import default_cache_dir; from agentrl_verl.models.smollm2 \
import GGUF_NAME, fetch_gguf; print(fetch_gguf(default_cache_dir()))")
rm -rf .gguf_part1 .gguf_part2
mkdir -p .gguf_part1 .gguf_part2
half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
head -c "$half" "$gguf" > .gguf_part1/part
tail -c +"$((half + 1))" "$gguf" > .gguf_part2/part
ls -l .gguf_part1/part .gguf_part2/part
