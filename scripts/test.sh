#!/usr/bin/env bash
# Set up (idempotent), lint, then run the test suite. Extra arguments go to pytest, e.g.
#   bash scripts/test.sh -m "not slow"      # fast tests only
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup.sh --vllm  # the vllm-marked tests run main_ppo from .venv-vllm
echo "[test] set-up took $((SECONDS - start)) s"
echo "[test] ruff"
.venv/bin/ruff check .
echo "[test] pytest"
# The 20 slowest tests are listed at the end: where the suite's time goes.
exec .venv/bin/python -m pytest --durations=20 "$@"
