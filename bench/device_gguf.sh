#!/usr/bin/env bash
# On the lent GPU machine: brings SmolLM2's GGUF over in three calls (bench/make_device_gguf.sh made the parts here),
# the environment side's wheels with the first (the demo's call then carries only the verl bundle):
#   call 1: carry [".gguf_part1", ".device_wheels.tar.xz"], command "bash bench/device_gguf.sh 1"
#   call 2: carry [".gguf_part2"], command "bash bench/device_gguf.sh 2"
#   call 3: carry [".gguf_part3"], command "bash bench/device_gguf.sh 3"   (joins them, checks the hash)
# They land in /tmp/agentrl_gguf/, which stays while the machine is warm (30 s after a call); bench/device_demo_gpu.sh
# takes the wheels from there and copies the file into the model cache, where `build-model smollm2` finds it.
set -euo pipefail
part=$1
mkdir -p /tmp/agentrl_gguf
cp ".gguf_part$part/part" "/tmp/agentrl_gguf/part$part"
[ -f .device_wheels.tar.xz ] && cp .device_wheels.tar.xz /tmp/agentrl_gguf/device_wheels.tar.xz
if [ "$part" = 3 ]; then
  name=$(python3 -c "import ast; t = ast.parse(open('agentrl_verl/models/smollm2.py').read()); print(next(
n.value.value for n in t.body if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == 'GGUF_NAME'))")
  cat /tmp/agentrl_gguf/part1 /tmp/agentrl_gguf/part2 /tmp/agentrl_gguf/part3 > "/tmp/agentrl_gguf/$name"
  rm /tmp/agentrl_gguf/part1 /tmp/agentrl_gguf/part2 /tmp/agentrl_gguf/part3
  sha256sum "/tmp/agentrl_gguf/$name"
fi
ls -l /tmp/agentrl_gguf
