#!/usr/bin/env bash
# On the lent GPU machine: brings SmolLM2's GGUF over in two calls (bench/make_device_gguf.sh made the halves here).
#   call 1: carry [".gguf_part1"], command "bash bench/device_gguf.sh 1"
#   call 2: carry [".gguf_part2"], command "bash bench/device_gguf.sh 2"   (joins them, checks the hash)
# The file lands in /tmp/agentrl_gguf/, which stays while the machine is warm (30 s after a call); the run that
# needs it (bench/device_demo_gpu.sh) copies it into the model cache, where `build-model smollm2` finds it.
set -euo pipefail
part=$1
mkdir -p /tmp/agentrl_gguf
cp ".gguf_part$part/part" "/tmp/agentrl_gguf/part$part"
if [ "$part" = 2 ]; then
  name=$(python3 -c "import ast, sys; t = ast.parse(open('agentrl_verl/models/smollm2.py').read()); print(next(
n.value.value for n in t.body if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'GGUF_NAME'))")
  cat /tmp/agentrl_gguf/part1 /tmp/agentrl_gguf/part2 > "/tmp/agentrl_gguf/$name"
  rm /tmp/agentrl_gguf/part1 /tmp/agentrl_gguf/part2
  sha256sum "/tmp/agentrl_gguf/$name"
fi
ls -l /tmp/agentrl_gguf
