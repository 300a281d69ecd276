#!/usr/bin/env bash
# Packs the environment side's wheels for the lent GPU machine (Python 3.12, no network there) as
# .device_wheels.tar.xz, unpacked: what kg, webshop and alfworld need beyond the verl bundle. The carry to that
# machine is limited to 64 MiB, the verl bundle takes 47 of them, so the wheels go unpacked into one .tar.xz (a third
# smaller than the wheels). See docs/gpu.md for the runs that carry it (bench/device_*.sh).
#   bash bench/make_device_wheels.sh        # after bash scripts/setup.sh (it takes ALFWorld's planner from .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$dir/wheels" \
  pyoxigraph==0.5.13 nltk==3.10.4 rapidfuzz==3.14.6 click==8.5.1 thefuzz==0.22.1 \
  textworld==1.7.0 alfworld==0.4.2 tatsu==5.8.3 hashids==1.3.1 mementos==1.3.1 \
  more_itertools==11.2.1 prompt_toolkit==3.0.53 wcwidth==0.9.4 termcolor==3.3.0 gguf==0.19.0
.venv/bin/python -c "import glob, sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in
glob.glob(sys.argv[1] + '/wheels/*.whl')]" "$dir"
rm -rf "$dir/wheels"
# ALFWorld's planner (fast-downward-textworld) and TextWorld's jericho >= 3.3 are published as source only: this
# environment's builds of them (py3-none-any packages around a shared library), the planner without its debug
# symbols (33 MB -> 1 MB).
site=$(.venv/bin/python -c "import jericho, pathlib; print(pathlib.Path(jericho.__file__).parents[1])")
cp -r "$site/fast_downward" "$site"/fast_downward_textworld-*.dist-info "$site/jericho" "$site"/jericho-*.dist-info "$dir/"
strip "$dir/fast_downward/libdownward.so"
tar cJf .device_wheels.tar.xz -C "$dir" .
ls -l .device_wheels.tar.xz
