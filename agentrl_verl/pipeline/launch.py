"""The one launch of verl's ``main_ppo`` that the demo and the benches share, and its supervision.

:func:`rl_command` composes the command line from a preset, its layers and the run's paths; :func:`run_main_ppo`
runs it in its own process group with the environment the project's runs are measured with (:func:`rl_environment`),
a stall watchdog, one retry when Ray's node misses its start-up wait, the shared-memory clean-up and a parent-death
signal; :class:`RLRun` does so in a thread, beside other work.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.pipeline.settings import RLSpec
from env_adapters.protocol import Index
from env_adapters.sandbox.servers import term_with_parent

logger = logging.getLogger(__name__)

def write_datasets(out: Path, train_indices: dict[str, list[Index]], held_out: dict[str, list[Index]],
                   weights: dict[str, float], rows: int, seed: int) -> tuple[Path, Path]:
    """verl parquet files: ``rows`` training rows shared by weight over training indices; held-out rows as val."""
    import pandas as pd

    from agentrl_verl.tools.data import build_datasets, make_row

    train, _ = build_datasets(train_indices, weights, train_size=rows, val_fraction=0.0, seed=seed)
    val = [make_row(task, i, "val") for task, indices in held_out.items() for i in indices]
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(train).to_parquet(out / "train.parquet", index=False)
    pd.DataFrame(val).to_parquet(out / "val.parquet", index=False)
    return out / "train.parquet", out / "val.parquet"


def rl_command(model_dir: str, train: Path, val: Path, env_url: str, out: Path, ray_dir: Path,
               spec: RLSpec, seed: int = 0, start_model_wait_s: float = 0.0) -> list[str]:
    """The ``main_ppo`` command line of the RL phase; with ``start_model_wait_s`` its trainer waits that long for
    ``model_dir`` to appear (a run started before its warm-up ends)."""
    from agentrl_verl.presets import CONFIG_DIR

    python = vllm_cpu.vllm_python() if spec.engine == "vllm" else sys.executable
    return [
        python, "-m", "verl.trainer.main_ppo", "--config-path", CONFIG_DIR, "--config-name", spec.preset(),
        *spec.layers(),
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={train}", f"data.val_files={val}",
        f"agentrl.env.url={env_url}",
        f"data.seed={seed}",
        f"trainer.total_training_steps={spec.steps}",
        f"trainer.save_freq={spec.steps}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        f"trainer.rollout_data_dir={out / 'rollouts'}",
        f"+ray_kwargs.ray_init._temp_dir={ray_dir}",
        *([f"++agentrl.start_model_wait_s={start_model_wait_s:g}"] if start_model_wait_s else []),
        *spec.overrides,
    ]


def format_progress(step: int, total: int, metrics: dict[str, float], tasks: list[str], seconds: float) -> str:
    """One progress line: step, then reward and success rate per task (training episodes of that step)."""
    parts = [f"RL step {step}/{total} ({seconds:.0f}s)"]
    for task in tasks:
        reward, success = metrics.get(f"agentrl/{task}/reward"), metrics.get(f"agentrl/{task}/success_rate")
        if reward is not None and success is not None:
            parts.append(f"{task}: reward {reward:+.2f} success {success:.2f}")
    return " | ".join(parts)


class RLStopped(RuntimeError):
    """The RL run ended before its last step; ``reason`` says why (for the summary)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def rl_environment(metrics_file: Path) -> dict[str, str]:
    """The environment of the ``main_ppo`` process.

    Ray starts its workers at nice 15 with ``OMP_NUM_THREADS=1`` (or the CPUs a bundle asks for, which on a small
    machine oversubscribes it). The demo's trainer and rollout workers are the heavy processes, so each gets every
    core the process may use, at normal priority, and OpenMP threads that wait passively
    (:mod:`agentrl_verl.harness.threads`): with libgomp's spinning default the trainer, the two rollout replicas and
    the agent loop fight over the cores (RL steps of 60-90 s instead of 8-15 s
    at load average 20-30). TransferQueue's own thread count defaults to 8, and it warns at every transfer
    on a machine with fewer cores (thousands of log lines per run). Ray starts a worker per core for the first
    driver's tasks, which verl's actors (each with its own runtime environment) never use: each imports Ray for
    nothing (1-1.5 s of CPU apiece). Values already set in the environment win.
    """
    cores = str(len(os.sched_getaffinity(0)))
    return {"OMP_NUM_THREADS": cores, "OMP_WAIT_POLICY": "PASSIVE", "TQ_NUM_THREADS": cores,
            "RAY_worker_niceness": "0", "RAY_prestart_worker_first_driver": "0", **os.environ,
            "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "RAY_DEDUP_LOGS": "0",
            "VERL_FILE_LOGGER_PATH": str(metrics_file), "PYTHONUNBUFFERED": "1"}


RAY_START_TIMEOUT = "The current node timed out during startup"
"""Ray's error when its raylet misses the fixed 30 s registration wait (``ray/_private/node.py``, not configurable):
on a loaded machine that can happen before anything of the run started."""


def run_main_ppo(cmd: list[str], out: Path, tasks: list[str], steps: int, stall_s: float,
           env: dict[str, str] | None = None, stop: threading.Event | None = None) -> list[dict[str, Any]]:
    """Run main_ppo in its own process group, log progress per step, and return the per-step metrics.

    Its output goes to ``out/verl.log`` and its metrics to ``out/metrics.jsonl`` (verl's file logger). A run that
    neither finishes a step nor prints a line for ``stall_s`` seconds is stalled and stopped. On any exit path
    (error, stall, Ctrl-C) the whole process group - verl and its Ray cluster - is stopped, and the shared-memory
    segments its processes left are removed (:func:`vllm_cpu.clean_up_run`). A run whose Ray node did not start in
    time (:data:`RAY_START_TIMEOUT`) is launched again, once. ``env`` adds to its environment
    (:meth:`RLSpec.platform_env`); setting ``stop`` (from another thread) stops the run within a second.

    Raises:
        RLStopped: the run stalled, was stopped, or exited with an error before its last step.
    """
    metrics_file, log_file = out / "metrics.jsonl", out / "verl.log"
    started = time.monotonic()
    stop = stop or threading.Event()
    for attempt in range(2):
        returncode, stalled, history = _launch(cmd, out, tasks, steps, stall_s, started, env or {}, stop)
        if stop.is_set():
            raise RLStopped(f"the RL run was stopped after step {len(history)}/{steps}")
        first_failed_to_start = attempt == 0 and returncode != 0 and not stalled and not history
        if first_failed_to_start and RAY_START_TIMEOUT in log_file.read_text(errors="replace"):
            logger.warning("the RL run's Ray node did not start in time (%s); launching it again", RAY_START_TIMEOUT)
            continue
        break
    done = len(read_jsonl(metrics_file)) if metrics_file.exists() else len(history)
    if stalled:
        raise RLStopped(f"the RL run stalled: no step finished and no output for {stall_s:.0f}s (rl.stall_s) "
                        f"after step {done}/{steps}; it was stopped (see {log_file})")
    if returncode != 0:
        tail = "".join(log_file.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise RLStopped(f"the RL run (main_ppo) exited with code {returncode} after step {done}/{steps}; "
                        f"end of {log_file}:\n{tail}")
    return read_jsonl(metrics_file) if metrics_file.exists() else history


def _launch(cmd: list[str], out: Path, tasks: list[str], steps: int, stall_s: float, started: float,
            env: dict[str, str], stop: threading.Event) -> tuple[int, bool, list[dict[str, Any]]]:
    """One launch of :func:`run_main_ppo`'s process; returns its exit code, whether it stalled, and the steps it
    logged."""
    metrics_file, log_file = out / "metrics.jsonl", out / "verl.log"
    history: list[dict[str, Any]] = []
    last_sign = [time.monotonic()]  # of life: a line or a finished step
    stalled = threading.Event()
    run_id, segments = uuid.uuid4().hex, vllm_cpu.shm_segments()
    with open(log_file, "w") as log:
        # SIGTERM from the kernel if the demo dies without stopping it (SIGKILLed): verl shuts Ray down.
        proc = subprocess.Popen(cmd, env={**rl_environment(metrics_file), **env, vllm_cpu.RUN_ID_ENV: run_id},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                cwd=out, preexec_fn=term_with_parent)

        def watch() -> None:  # a thread, since a hung run prints nothing the loop below could react to
            # Every second: a driver that exited while leftovers hold its output open ends the loop below only here.
            while proc.poll() is None and time.monotonic() - last_sign[0] <= stall_s and not stop.is_set():
                time.sleep(min(1.0, stall_s / 10))
            if proc.poll() is None and not stop.is_set():
                stalled.set()
            _stop_group(proc)  # also when the driver died: Ray's leftovers would hold its output open

        watchdog = threading.Thread(target=watch, name="rl-stall-watchdog", daemon=True)
        watchdog.start()
        try:
            for line in proc.stdout:
                last_sign[0] = time.monotonic()
                log.write(line)
                if "step:" in line and metrics_file.exists():
                    for row in read_jsonl(metrics_file)[len(history):]:
                        history.append(row)
                        logger.info("%s", format_progress(row["step"], steps, row["data"], tasks,
                                                          time.monotonic() - started))
            proc.wait()
        finally:
            _stop_group(proc)
            watchdog.join()
            # main_ppo's driver does this at its exit, which a killed driver never reaches.
            vllm_cpu.clean_up_run(run_id, segments)
    return proc.returncode, stalled.is_set(), history


class RLRun:
    """:func:`run_main_ppo` in a thread of its own, so that a run's other phases go on beside verl's start-up (the
    evaluation before RL, and on a GPU the warm-up too).

    Args:
        cmd: The ``main_ppo`` command (:func:`rl_command`).
        out: The demo's output directory (the run's log and metrics go there).
        tasks: Task names, for the progress lines.
        spec: Steps, stall limit and platform of the run.
    """

    def __init__(self, cmd: list[str], out: Path, tasks: list[str], spec: RLSpec) -> None:
        self.started: float | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None

        def run() -> None:
            try:
                run_main_ppo(cmd, out, tasks, spec.steps, spec.stall_s, env=spec.platform_env(), stop=self._stop)
            except BaseException as error:  # raised again in the demo's thread, by wait()
                self._error = error

        self._cmd = cmd
        self._thread = threading.Thread(target=run, name="rl-run", daemon=True)

    def start(self) -> None:
        logger.info("RL: %s", " ".join(self._cmd))
        self.started = time.monotonic()
        self._thread.start()

    def wait(self) -> None:
        """Until the run has ended (Ctrl-C still reaches the demo's thread meanwhile).

        Raises:
            RLStopped: as :func:`run_main_ppo`.
        """
        while self._thread.is_alive():
            self._thread.join(0.5)
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Stop the run, if started, and wait until it and its processes are gone (on the demo's own error)."""
        self._stop.set()
        if self.started is not None:
            self._thread.join()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (verl's file logger writes one per step)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGINT the run's process group (verl and Ray shut down cleanly), SIGKILL whatever is left after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            logger.warning("main_ppo did not stop within 30s of SIGINT; killing its process group")
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # Ray's helpers share the group and may outlive the driver
    except ProcessLookupError:
        pass
    proc.wait()


def exported_actor(checkpoints: Path, step: int) -> Path:
    """The HF export verl wrote for the actor at ``step`` (``save_contents`` includes ``hf_model``)."""
    path = checkpoints / f"global_step_{step}" / "actor" / "huggingface"
    if not (path / "config.json").exists() or not any(path.glob("*.safetensors")):
        raise FileNotFoundError(f"no HF export of the actor at {path}; the RL preset must save hf_model "
                                "(actor_rollout_ref.actor.checkpoint.save_contents)")
    return path




def rl_preset_values(spec: RLSpec, *extra: str):
    """The composed RL preset with ``spec``'s overrides and ``extra`` (for values the demo needs up front, e.g. the
    batch size)."""
    from hydra import compose, initialize_config_dir

    from agentrl_verl.presets import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=spec.preset(), overrides=[*spec.layers(), *spec.overrides, *extra])


def check_rl_settings(spec: RLSpec) -> None:
    """Validate the RL phase's ``agentrl.*`` settings (the preset plus overrides) as its driver will, up front.

    Raises:
        ConfigError: an unknown or mistyped key, or a contradictory combination (the message names the key).
    """
    from agentrl_verl.core.config import validate_run_config

    # The environment's address is known only once the stack runs; any address passes this check.
    validate_run_config(rl_preset_values(spec, "agentrl.env.url=http://127.0.0.1:1"))
