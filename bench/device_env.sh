# Sourced by bench/device_*.sh on a GPU machine lent by the `device` tool, from the repo root: installs the carried
# verl bundle (.verl_bundle, see its install.sh) into /tmp/site, unpacks WHEELS there if given (a folder of wheels
# that need no install step, or their unpacked contents as one .tar.xz, a third smaller: the carry is limited to 64
# MiB), and exports what the runs need.
# The repo is not pip-installed there, so the plugin is loaded by module name instead of its entry point; the CPU
# platform is asked for explicitly (the host has a GPU; hiding it would make Ray refuse the logical GPUs the CPU
# preset asks for), unless DEVICE_GPU=1 (benches of the GPU path).
bash .verl_bundle/install.sh .verl_bundle /tmp/site >/dev/null || { echo "bundle install failed"; exit 1; }
# The plugin's post-import hooks need wrapt, which the shared bundle does not bring: add its wheel to the bundle here
# (pip download wrapt --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --no-deps -d .verl_bundle).
PYTHONPATH=/tmp/site python3 -c "import wrapt" 2>/dev/null \
  || { echo "wrapt is missing: add its cp312 wheel to .verl_bundle (see bench/device_env.sh)"; exit 1; }
if [ -f "${WHEELS:-}" ]; then
  tar xJf "$WHEELS" -C /tmp/site || { echo "wheels failed"; exit 1; }
elif [ -n "${WHEELS:-}" ]; then
  python3 -c "import sys, zipfile; [zipfile.ZipFile(w).extractall('/tmp/site') for w in sys.argv[1:]]" "$WHEELS"/*.whl \
    || { echo "wheels failed"; exit 1; }
fi
# install.sh installs with --no-compile, and the image's own packages (torch, transformers, ...) may lack bytecode
# too (an image built with --no-compile or PYTHONDONTWRITEBYTECODE): without this every process of a run would
# compile what it imports (a pip install compiles at install time, so this is how a user's machine starts). Where
# bytecode is there already, compileall only compares timestamps.
IMAGE_SITE=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
started=$SECONDS
python3 -m compileall -q -j 0 /tmp/site "$IMAGE_SITE" agentrl_verl env_adapters bench >/dev/null 2>&1
echo "bytecode of /tmp/site and $IMAGE_SITE: $((SECONDS - started)) s (PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset})"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled \
       VERL_USE_EXTERNAL_MODULES=agentrl_verl.plugin AGENTRL_CACHE_DIR=${AGENTRL_CACHE_DIR:-$PWD/.cache/agentrl}
[ "${DEVICE_GPU:-0}" = 1 ] || export AGENTRL_PLATFORM=cpu VERL_PLATFORM=cpu
