#!/usr/bin/env bash
# Set up (idempotent), lint, build the docs, then run the test suite. Extra arguments go to pytest, e.g.
#   bash scripts/test.sh -m "not slow"      # fast tests only
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup.sh --vllm  # the vllm-marked tests run main_ppo from .venv-vllm
echo "[test] set-up took $((SECONDS - start)) s"
echo "[test] ruff"
.venv/bin/ruff check .
echo "[test] docs"
# --strict: a broken link, a missing anchor or a page left out of the navigation fails the build.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
# Two workers (AGENTRL_TEST_WORKERS), each test module one unit and the long units first (tests/conftest.py): most
# end-to-end runs wait on processes and timers for part of their time, so two at a time use the cores that one
# leaves idle. The 20 slowest tests are listed at the end: where the suite's time goes.
workers=${AGENTRL_TEST_WORKERS:-2}
echo "[test] pytest ($workers workers)"
pytest_start=$SECONDS
rc=0
.venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder --durations=20 "$@" || rc=$?
echo "[test] pytest took $((SECONDS - pytest_start)) s; the whole run $((SECONDS - start)) s"
exit "$rc"
