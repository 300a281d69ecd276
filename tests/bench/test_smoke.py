"""Every bench runs, at its smallest size, as a user starts it (``python -m bench.NAME ...``), so that none can rot
unseen between the runs that record its figures. Each prints its ``key=value`` result line (or its report) and exits
0. The benches of verl runs (``ablation``, ``async_vs_sync``, ``demo_seeds``) and the report tools
(``stack_profile``, ``startup_timeline``, ``gpu_recipe``) have test modules of their own that run their main paths;
``hf_weight_update`` compares CUDA IPC with the object store and needs a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from env_adapters.sandbox.containers import docker_available

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 900
"""Only against a hung bench: each ends in seconds to a minute here."""

SMOKES: dict[str, list[str]] = {
    "webshop": ["--products", "2000", "--goals", "60", "--queries", "20", "--episodes", "5"],
    "controller": ["--duration", "0.2", "--sessions", "40", "--ramp", "8", "--latency-samples", "20",
                   "--http", "ours,aiohttp"],
    "kg": ["--items", "4", "--backends", "embedded"],
    "alfworld": ["--sessions", "4", "--concurrent", "2", "--steps", "2"],
    "hf_rollout": ["--model", "tiny", "--device", "cpu", "--concurrency", "1", "2", "--prompt-len", "8",
                   "--new-tokens", "8", "--repeats", "1"],
    "logprobs": ["--device", "cpu", "--cases", "demo", "--repeats", "1"],
    "webshop_upstream": [],
    "warmup_curves": ["--steps", "2", "--eval-every", "2", "--eval-indices", "2", "--set", "demonstrations=16"],
}
"""Bench -> its smallest run's arguments (the command line a user would type)."""
DOCKER_SMOKES = {
    "env_start": ["--sessions", "2", "--pool-size", "1", "--gap", "0.1"],
    "os_disk": ["--disk", "64m", "--write-mib", "128"],
}
"""Benches of the ``os`` task: they start containers."""


def run_bench(name: str, args: list[str], python: str = sys.executable) -> str:
    done = subprocess.run([python, "-m", f"bench.{name}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, f"bench.{name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_runnable_bench_has_a_smoke_here_or_a_test_module():
    benches = {p.stem for p in (ROOT / "bench").glob("*.py")} - {"__init__", "common", "http_libraries"}
    own_tests = {p.stem.removeprefix("test_") for p in Path(__file__).parent.glob("test_*.py")}
    elsewhere = {"vllm_rollout", "env_scale", "hf_weight_update"}  # below, and the one that needs a GPU
    assert benches - set(SMOKES) - set(DOCKER_SMOKES) - own_tests - elsewhere == set()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKES))
def test_the_bench_runs_at_its_smallest_size(name):
    out = run_bench(name, SMOKES[name])
    assert out.strip(), f"bench.{name} printed nothing"
    last = out.strip().splitlines()[-1]
    assert "=" in last or name in REPORTS, last  # the result line


REPORTS = {"warmup_curves", "webshop_upstream"}
"""Benches that end with their report instead of a ``key=value`` line (a table; the comparisons with upstream)."""


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.skipif(not docker_available(), reason="no Docker daemon answers")
@pytest.mark.parametrize("name", sorted(DOCKER_SMOKES))
def test_the_os_bench_runs_at_its_smallest_size(name):
    assert "=" in run_bench(name, DOCKER_SMOKES[name]).strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.vllm
def test_the_vllm_rollout_bench_runs_at_its_smallest_size():
    from agentrl_verl.backends import vllm_cpu

    out = run_bench("vllm_rollout", ["--model", "tiny", "--concurrency", "1", "--prompt-len", "8", "--new-tokens", "8",
                                     "--repeats", "1"], python=vllm_cpu.vllm_python())
    assert "=" in out.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_ray_scaling_bench_runs_at_its_smallest_size():
    out = run_bench("env_scale", ["--duration", "1", "--clients", "1", "--concurrency", "2", "--rounds", "2"])
    assert "=" in out.strip().splitlines()[-1]
