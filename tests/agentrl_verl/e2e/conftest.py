"""Harness of the CPU end-to-end tests: verl's real ``main_ppo`` in a subprocess, and environment stacks that
serve this folder's test tasks.

Test files cannot import each other (pytest's importlib mode), so the harness is handed out as fixtures:

- ``main_ppo(workdir, model_path, name, *overrides, agentrl_agent=True, timeout_s=RUN_TIMEOUT_S, env=None,
  python=sys.executable, preset="cpu_tiny", started=None, returncode=0, ray_address=None) -> log``: one run of
  ``python -m verl.trainer.main_ppo`` with the preset (``cpu_tiny``, or ``cpu_vllm``) in its own session and Ray
  cluster (private temp dir; ``ray_address``: on that running cluster instead), killed on timeout; ``started`` gets
  the driver's ``Popen``; the log is written to ``workdir/NAME.log`` and an exit code other than ``returncode`` fails
  the test. Episodes run the ``agentrl_agent`` loop, scored by their environment (no reward worker is started);
  ``agentrl_agent=False``: verl's default loop, scored by the ``arith_data`` reward.
- ``run_main_ppo(workdir, model_path, name, *overrides, **kwargs) -> (log, {step: metrics})``: ``main_ppo`` with a
  larger learning rate, metrics parsed from the console logger.
- ``start_stack(workers, controller=None)``: a context manager running an :class:`EnvStack` (``controller``: its
  controller's settings) whose workers can import the test tasks of this folder (``chatter_task:ChatterTask``,
  ``latency_chatter_task:LatencyChatterTask``).
- ``held_stack``: a stack (and its release file) whose multi-turn episodes are held at their first step, except those
  of the first batch's prompts, until the file exists; ``hold_first_update(release) -> env``: the environment of a
  run whose first weight update creates the file and lands only once a released turn is decoding
  (``hold_update.py``): an update that finds a turn decoding by construction, not by timing.
- ``arith_data``: the ``arith_data`` module (dataset writer and reward function).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentrl_verl.pipeline.launch import RAY_START_TIMEOUT
from agentrl_verl.presets import CONFIG_DIR
from env_adapters.launcher import EnvStack

HERE = Path(__file__).parent
ARITH = HERE / "arith_data.py"
RUN_TIMEOUT_S = 540  # a hang guard below pytest-timeout's 600 s: a verl run here takes 70-300 s, more beside heavy work
# Larger than the preset's so that two steps move the actor visibly away from a frozen rollout.
LR = "5e-3"
# The environment scores every episode of the agentrl_agent loop: a reward worker (one more process importing verl,
# about 12 CPU-s of a run's start-up here) would only idle.
AGENTRL_AGENT = ["actor_rollout_ref.rollout.agent.default_agent_loop=agentrl_agent", "reward.num_workers=0"]


def parse_step_metrics(log: str) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` from the console logger's ``step:N - key:value - ...`` lines; numpy reprs
    such as ``np.int32(2)`` are unwrapped, non-numeric values skipped."""
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        match = re.search(r"step:(\d+) - (.*)$", line)
        if not match:
            continue
        metrics = {}
        for item in match.group(2).split(" - "):
            key, _, value = item.rpartition(":")
            value = value.strip()
            wrapped = re.fullmatch(r"np\.\w+\((.*)\)", value)
            try:
                metrics[key] = float(wrapped.group(1) if wrapped else value)
            except ValueError:
                continue
        steps[int(match.group(1))] = metrics
    return steps


def main_ppo(workdir: Path, model_path: Path, name: str, *overrides: str, agentrl_agent: bool = True,
             timeout_s: float = RUN_TIMEOUT_S, env: Mapping[str, str] | None = None, python: str = sys.executable,
             preset: str = "cpu_tiny", started: Callable[[subprocess.Popen], None] | None = None, returncode: int = 0,
             ray_address: str | None = None) -> str:
    """Run main_ppo with ``preset`` on ``workdir``'s train/val parquet files under ``python``; return its log.
    ``agentrl_agent``: the episodes' loop (else verl's default, with the arith reward); ``started`` gets the driver's
    process once it runs; the run must exit with ``returncode``; ``ray_address``: the run joins that cluster, which
    offers its resources (the preset's ``num_cpus``/``num_gpus`` are for a cluster of its own)."""
    ray_dir = Path("/tmp") / f"e2eray{os.getpid()}_{name}"  # short: Ray's socket paths have a length limit
    if ray_address is None:
        cluster = [f"+ray_kwargs.ray_init._temp_dir={ray_dir}"]
    else:
        cluster = [f"+ray_kwargs.ray_init.address={ray_address}", "ray_kwargs.ray_init.num_cpus=null",
                   "ray_kwargs.ray_init.num_gpus=null"]
    cmd = [
        python, "-m", "verl.trainer.main_ppo",
        "--config-path", CONFIG_DIR, "--config-name", preset,
        f"actor_rollout_ref.model.path={model_path}",
        f"data.train_files={workdir / 'train.parquet'}",
        f"data.val_files={workdir / 'val.parquet'}",
        f"trainer.default_local_dir={workdir / 'ckpt'}",
        *(AGENTRL_AGENT if agentrl_agent else [f"reward.custom_reward_function.path={ARITH}"]),
        *cluster,
        *overrides,
    ]
    # No idle Ray worker per core for the driver's tasks: verl's actors never use them (as the demo's runs).
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "RAY_DEDUP_LOGS": "0",
           "RAY_prestart_worker_first_driver": "0", **(env or {})}
    for attempt in range(2):
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            if started is not None:
                started(proc)
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole session: the driver's Ray cluster too
            log, _ = proc.communicate()
            pytest.fail(f"main_ppo ({name}) timed out after {timeout_s}s; tail:\n{log[-4000:]}")
        except BaseException:  # e.g. pytest-timeout's or Ctrl-C's exception: the run must not outlive the test
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            subprocess.run(["rm", "-rf", str(ray_dir)], check=False)
        (workdir / f"{name}.log").write_text(log)
        if attempt == 0 and proc.returncode != 0 and RAY_START_TIMEOUT in log:
            # The demo's run_rl does the same (RAY_START_TIMEOUT says why).
            print(f"main_ppo ({name}): Ray's node did not start in time; launching again", file=sys.stderr)
            continue
        break
    assert proc.returncode == returncode, f"main_ppo ({name}) exited with {proc.returncode}; tail:\n{log[-6000:]}"
    return log


def run_main_ppo(workdir: Path, model_path: Path, name: str, *overrides: str,
                 **kwargs: Any) -> tuple[str, dict[int, dict]]:
    """:func:`main_ppo` (``kwargs`` go to it) with :data:`LR`; return its log and per-step console metrics."""
    log = main_ppo(workdir, model_path, name, f"actor_rollout_ref.actor.optim.lr={LR}", *overrides, **kwargs)
    return log, parse_step_metrics(log)


@contextlib.contextmanager
def start_stack(workers: list[dict[str, Any]], controller: dict[str, Any] | None = None) -> Iterator[EnvStack]:
    """An environment stack (controller on a free port, with ``controller``'s settings) of ``workers``, which may name
    this folder's tasks."""
    with pytest.MonkeyPatch.context() as mp:
        # The worker subprocesses import the test tasks from this folder.
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
        with EnvStack({"controller": {"port": 0, **(controller or {})}, "workers": workers}) as stack:
            yield stack


BATCH_PROMPTS = 4
"""``data.train_batch_size`` of the ``cpu_tiny`` and ``cpu_vllm`` presets."""


def hold_first_update(release: Path) -> dict[str, str]:
    """The environment of a run whose first update waits for a released turn to decode (``hold_update.py``)."""
    return {"AGENTRL_TEST_RELEASE_FILE": str(release),  # hold_update.RELEASE_ENV (test files cannot import each other)
            "VERL_USE_EXTERNAL_MODULES": "agentrl_verl.plugin,hold_update",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def held_stack(tmp_path: Path) -> Iterator[tuple[EnvStack, Path]]:
    """Instant multi-turn episodes, those of all but the first batch's prompts held until the first update
    (``held_chatter_task.py``); 64 indices, so that no prompt of the data is repeated."""
    release = tmp_path / "release"
    worker = {"task": "held_chatter_task:HeldChatterTask", "name": "chatter", "concurrency": 32,
              "options": {"rounds": 4, "size": 64, "free_prompts": BATCH_PROMPTS, "release_file": str(release)}}
    with start_stack([worker]) as env:
        yield env, release


@pytest.fixture(name="hold_first_update", scope="session")
def _hold_first_update() -> Callable[[Path], dict[str, str]]:
    return hold_first_update


@pytest.fixture(name="main_ppo", scope="session")
def _main_ppo() -> Callable[..., str]:
    return main_ppo


@pytest.fixture(name="run_main_ppo", scope="session")
def _run_main_ppo() -> Callable[..., tuple[str, dict[int, dict]]]:
    return run_main_ppo


@pytest.fixture(name="start_stack", scope="session")
def _start_stack() -> Callable[..., contextlib.AbstractContextManager[EnvStack]]:
    return start_stack


@pytest.fixture(scope="session")
def arith_data() -> ModuleType:
    # Loaded by path, as verl's reward workers load it (this folder is no package).
    spec = importlib.util.spec_from_file_location("arith_data", ARITH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
