"""``agentrl-verl demo``: the first thing to run - agentic RL of a tiny model on CPU, end to end, no downloads.

What it does, in order (settings: ``harness/presets/demo_run.yaml``, RL preset ``presets/demo/tiny.yaml``):

1. Starts its own environment stack: a controller and workers of ``calc`` (learnable function calling), ``db``
   (DBBench on embedded SQLite) and ``os`` (OS interaction in Docker containers, when a daemon answers).
2. Builds (once, cached) the tiny offline model and tokenizer.
3. Cold start: generates demonstrations of each learnable task (``calc`` by default) with its scripted expert
   through the real task code and trains on them until greedy held-out success enters a window that leaves RL
   room (:mod:`.cold_start`). With ``warmup.reuse`` a model warmed up by an earlier run with the same settings is
   taken from the cache instead (:mod:`.warmup_cache`), and a new one is kept there.
4. Evaluates every task on held-out indices through the stack (greedy, and sampled) with the agent loop that
   trains (:func:`agentrl_verl.tools.evaluate.evaluate_model`), on the warm-up's device.
5. RL: ``python -m verl.trainer.main_ppo`` with our agent loop, task-normalised GRPO, the asynchronous trainer and
   cross-policy sampling, showing each step's reward and success per task as it goes. A run that stalls (no
   step and no output for ``rl.stall_s``) is stopped; there is no limit on its length. It is launched before
   step 4, whose evaluation plays beside verl's start-up; where the warm-up trains on a GPU, before steps 2 and 3
   too (``rl.start_with_warmup``), its trainer waiting for the warmed-up model (``agentrl.start_model_wait_s``).
6. Loads the actor verl saved (its HF export) and evaluates again on the same held-out indices.
7. Writes ``summary.json``, ``summary.md`` (a table), ``learning_curve.png`` and ``trajectories.jsonl`` to
   ``--output-dir``.

Everything it starts (environment processes, containers, the verl run and its Ray cluster) is stopped at the
end, also on Ctrl-C or an error; an early end still writes the summary of what was measured, saying why. The
last line printed is ``key=value`` pairs of the headline numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.harness.cold_start import (
    WarmupConfig,
    WarmupResult,
    device_setting,
    generate_demonstrations,
    supervised_warmup,
)
from agentrl_verl.harness.threads import relaunch_with_demo_threads
from agentrl_verl.harness.tiny_model import TinyModelSpec, build_tiny_model, default_cache_dir, tiny_model_path
from agentrl_verl.harness.warmup_cache import build_whole, cache_path, cached_warmup
from agentrl_verl.tools.evaluate import EvalResult, evaluate_model
from env_adapters.protocol import Index
from env_adapters.sandbox.containers import docker_available
from env_adapters.sandbox.servers import term_with_parent

logger = logging.getLogger(__name__)

DEMO_LAYER = "+demo=tiny"
"""The demo's layer on main_ppo's primary config (``agentrl_verl/harness/presets/demo/tiny.yaml``)."""
ENGINES = {"hf": {"cpu": "cpu_tiny", "cuda": "gpu_tiny"}, "vllm": {"cpu": vllm_cpu.PRESET}}
"""Rollout engine -> device -> main_ppo's primary config (presets/). verl's vLLM rollout runs here on the CPU only
(``cpu_vllm``); on a GPU the demo serves with ``hf``."""
DEVICE_LAYERS = {"cuda": "+demo/device=gpu"}
"""Device -> the demo's layer for it, over :data:`DEMO_LAYER` (``presets/demo/device/``)."""
CPU_PLATFORM_ENV = {"AGENTRL_PLATFORM": "cpu", "VERL_PLATFORM": "cpu"}
"""What makes verl take the CPU platform on a host that has a GPU (agentrl_verl.backends.platform_cpu)."""


# ---- settings -----------------------------------------------------------------------------------------


@dataclass
class TaskSpec:
    """One task of the demo: a worker of the stack, its share of RL prompts and its held-out indices.

    A ``learnable`` task gets ``demonstrations`` expert episodes for the warm-up (default: the demo's
    ``demonstrations``).
    """

    name: str
    family: str
    options: dict[str, Any] = field(default_factory=dict)
    concurrency: int = 16
    weight: float = 1.0
    held_out: int = 20
    learnable: bool = False
    demonstrations: int | None = None
    needs_docker: bool = False

    def demonstration_count(self, default: int) -> int:
        """Expert episodes of the warm-up: 0 unless learnable, else :attr:`demonstrations` or ``default``."""
        return 0 if not self.learnable else default if self.demonstrations is None else self.demonstrations


@dataclass
class EvalSpec:
    """How held-out evaluation plays episodes (the training agent loop, see :mod:`agentrl_verl.tools.evaluate`)."""

    warmup_indices: int = 100
    sampled: bool = True
    temperature: float = 0.8
    max_turns: int = 4
    max_new_tokens: int = 48
    max_context: int = 640


@dataclass
class RLSpec:
    """The verl run: training steps, stall detection, extra Hydra overrides of the ``+demo=tiny`` layer, the engine.

    ``stall_s`` is no limit on the run's length (its speed depends on the machine): the run is stopped only when it
    has neither finished a step nor printed a line for that long.
    """

    steps: int = 40
    stall_s: float = 900.0
    overrides: list[str] = field(default_factory=list)
    engine: str = "hf"  # or "vllm": verl's vLLM rollout on CPU, run from .venv-vllm (bash scripts/setup.sh --vllm)
    device: str = "auto"  # cuda (one GPU: the trainer and both rollout replicas), cpu, or auto (cuda where torch sees
    # one and the engine serves there, unless AGENTRL_PLATFORM=cpu asks for verl's CPU platform)
    start_with_warmup: str = "auto"
    """Launch verl's run before the warm-up, which trains while verl starts (its trainer waits for the model):
    ``auto`` where the warm-up trains on a GPU (on a CPU the two would share the cores), ``true`` or ``false``."""

    def starts_with_warmup(self, warmup_device: str) -> bool:
        """:attr:`start_with_warmup` resolved for a warm-up on ``warmup_device`` (``warmup.device``).

        Raises:
            ValueError: not ``auto``, ``true`` or ``false``.
        """
        choice = str(self.start_with_warmup).lower()  # YAML's true arrives as "True"
        if choice == "auto":
            return device_setting(warmup_device, "warmup.device") == "cuda"
        if choice not in ("true", "false"):
            raise ValueError(f"rl.start_with_warmup={self.start_with_warmup!r}: use auto, true or false")
        return choice == "true"

    def resolved_device(self) -> str:
        """:attr:`device` resolved: ``auto`` is ``cuda`` where torch sees a GPU and the engine serves on one.

        Raises:
            ValueError: an unknown device, ``cuda`` without a GPU or with verl's CPU platform asked for, or an engine
                that does not serve on it.
        """
        if self.engine not in ENGINES:
            raise ValueError(f"rl.engine={self.engine!r}: use one of {', '.join(ENGINES)}")
        from agentrl_verl.backends.platform_cpu import cpu_platform_requested

        if self.device == "auto":
            if cpu_platform_requested() or "cuda" not in ENGINES[self.engine]:
                return "cpu"  # AGENTRL_PLATFORM=cpu (or VERL_PLATFORM=cpu) asks for the CPU on a GPU host too
            return device_setting("auto", "rl.device")
        device = device_setting(self.device, "rl.device")
        if device == "cuda" and cpu_platform_requested():
            raise ValueError("rl.device=cuda, but AGENTRL_PLATFORM/VERL_PLATFORM=cpu asks verl for its CPU platform: "
                             "unset it, or use rl.device=cpu")
        if device not in ENGINES[self.engine]:
            raise ValueError(f"rl.device={device} with rl.engine={self.engine}: the demo runs {self.engine} on "
                             f"{' or '.join(ENGINES[self.engine])} only; use rl.engine=hf on a GPU")
        return device

    def preset(self) -> str:
        """main_ppo's primary config for :attr:`engine` on :meth:`resolved_device` (``cpu_tiny``, ``gpu_tiny`` or
        ``cpu_vllm``)."""
        device = self.resolved_device()
        return ENGINES[self.engine][device]

    def layers(self) -> list[str]:
        """The demo's layers on :meth:`preset`: :data:`DEMO_LAYER`, then the device's (:data:`DEVICE_LAYERS`)."""
        device = self.resolved_device()
        return [DEMO_LAYER, *([DEVICE_LAYERS[device]] if device in DEVICE_LAYERS else [])]

    def platform_env(self) -> dict[str, str]:
        """Environment of the verl run: on the CPU, verl's CPU platform also where a GPU is present."""
        return dict(CPU_PLATFORM_ENV) if self.resolved_device() == "cpu" else {}


@dataclass
class DemoWarmup(WarmupConfig):
    """The demo's warm-up: :class:`~agentrl_verl.harness.cold_start.WarmupConfig`'s training settings, and whether
    to reuse a model that an earlier run with the same settings left in the cache."""

    reuse: bool = False
    """Reuse (or else train and keep) the warm-up model cached under ``$AGENTRL_CACHE_DIR/demo/`` for exactly these
    settings (:func:`warmup_settings`). Off: every run trains its own warm-up into its output directory."""

    def model_settings(self) -> dict[str, Any]:
        """The settings that shape the warmed-up model (all but :attr:`reuse`)."""
        return {k: v for k, v in asdict(self).items() if k != "reuse"}


@dataclass
class DemoConfig:
    seed: int = 0
    tasks: list[TaskSpec] = field(default_factory=list)
    demonstrations: int = 2000
    warmup: DemoWarmup = field(default_factory=DemoWarmup)
    eval: EvalSpec = field(default_factory=EvalSpec)
    rl: RLSpec = field(default_factory=RLSpec)
    model: TinyModelSpec = field(default_factory=TinyModelSpec)
    """The tiny model's shape (built once per shape and cached)."""


def load_demo_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> DemoConfig:
    """The demo settings: the embedded ``demo_run.yaml`` (or ``path``) with ``KEY=VALUE`` overrides, validated.

    Raises:
        ValueError: an unknown key or a value of the wrong type, named in the message.
    """
    default = resources.files("agentrl_verl.harness.presets") / "demo_run.yaml"
    text = Path(path).read_text() if path else default.read_text()
    try:
        schema = OmegaConf.structured(DemoConfig)
        OmegaConf.set_readonly(schema.model, False)  # TinyModelSpec is frozen; its fields are settings here
        merged = OmegaConf.merge(schema, OmegaConf.create(text))
        for override in overrides or []:
            key, sep, value = override.partition("=")
            if not sep:
                raise ValueError(f"override {override!r} is not KEY=VALUE")
            # update (not a dotlist merge) so that list items can be addressed: tasks.0.held_out=50
            OmegaConf.update(merged, key, yaml.safe_load(value), merge=True)
    except Exception as e:  # omegaconf raises several unrelated types for bad keys and values
        raise ValueError(f"invalid demo settings ({path or 'demo_run.yaml'}, overrides {overrides}): {e}") from e
    config: DemoConfig = OmegaConf.to_object(merged)
    if not any(t.learnable for t in config.tasks):
        raise ValueError("the demo needs one task with learnable: true (it gets the warm-up demonstrations)")
    config.rl.starts_with_warmup(config.warmup.device)  # a bad value stops here, not after the stack is up
    return config


# ---- the environment ----------------------------------------------------------------------------------




def stack_config(tasks: list[TaskSpec]) -> dict[str, Any]:
    """An :class:`~env_adapters.launcher.EnvStack` config: the controller on a free loopback port, a worker per task."""
    workers = [{"task": t.family, "name": t.name, "concurrency": t.concurrency, "options": dict(t.options)}
               for t in tasks]
    return {"controller": {"host": "127.0.0.1", "port": 0}, "workers": workers}


def warmup_settings(base: Path, config: DemoConfig, tasks: list[TaskSpec]) -> dict[str, Any]:
    """What shapes the demo's warm-up model when ``tasks`` run, as JSON values (the key of its cached copy): the base
    model, each learnable task's problems, demonstrations, held-out split and check concurrency, the seed, the
    warm-up settings (device resolved) and the evaluation settings its greedy checks use. RL settings, task weights
    and the tasks that are not learnable leave it unchanged."""
    learnable = [{"name": t.name, "family": t.family, "options": t.options, "held_out": t.held_out,
                  "concurrency": min(t.concurrency, 64), "demonstrations": t.demonstration_count(config.demonstrations)}
                 for t in tasks if t.learnable]
    checks = {k: v for k, v in asdict(config.eval).items() if k in ("warmup_indices", "max_turns", "max_new_tokens",
                                                                     "max_context")}
    warmup = {**config.warmup.model_settings(), "device": device_setting(config.warmup.device, "warmup.device")}
    return {"base": base.name, "seed": config.seed, "tasks": learnable, "warmup": warmup, "eval": checks}


async def task_indices(url: str, tasks: list[TaskSpec]) -> dict[str, list[Index]]:
    """Every index the controller at ``url`` serves for each of ``tasks``, by task name."""
    from env_adapters.client import EnvClient

    async with EnvClient(url) as client:
        return {t.name: list(await client.get_indices(t.name)) for t in tasks}


def evaluate_tasks(url: str, model, tokenizer, splits: dict[str, list[Index]], spec: EvalSpec,
                   sessions: dict[str, int], greedy: bool = True, seed: int = 0) -> dict[str, EvalResult]:
    """Evaluate ``model`` on each task's held-out indices through the stack at ``url`` with the training agent loop,
    at most ``sessions[task]`` episodes at once (the task's worker concurrency)."""
    return evaluate_model(url, model, tokenizer, splits, greedy=greedy, temperature=spec.temperature,
                          max_turns=spec.max_turns, max_new_tokens=spec.max_new_tokens, max_context=spec.max_context,
                          concurrency=sessions, seed=seed)


# ---- the verl run -------------------------------------------------------------------------------------


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
    from agentrl_verl.harness.presets import CONFIG_DIR

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


def run_rl(cmd: list[str], out: Path, tasks: list[str], steps: int, stall_s: float,
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
        returncode, stalled, history = _launch_rl(cmd, out, tasks, steps, stall_s, started, env or {}, stop)
        if stop.is_set():
            raise RLStopped(f"the RL run was stopped after step {len(history)}/{steps}")
        first_failed_to_start = attempt == 0 and returncode != 0 and not stalled and not history
        if first_failed_to_start and RAY_START_TIMEOUT in log_file.read_text(errors="replace"):
            logger.warning("the RL run's Ray node did not start in time (%s); launching it again", RAY_START_TIMEOUT)
            continue
        break
    done = len(_read_jsonl(metrics_file)) if metrics_file.exists() else len(history)
    if stalled:
        raise RLStopped(f"the RL run stalled: no step finished and no output for {stall_s:.0f}s (rl.stall_s) "
                        f"after step {done}/{steps}; it was stopped (see {log_file})")
    if returncode != 0:
        tail = "".join(log_file.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise RLStopped(f"the RL run (main_ppo) exited with code {returncode} after step {done}/{steps}; "
                        f"end of {log_file}:\n{tail}")
    return _read_jsonl(metrics_file) if metrics_file.exists() else history


def _launch_rl(cmd: list[str], out: Path, tasks: list[str], steps: int, stall_s: float, started: float,
               env: dict[str, str], stop: threading.Event) -> tuple[int, bool, list[dict[str, Any]]]:
    """One launch of :func:`run_rl`'s process; returns its exit code, whether it stalled, and the steps it logged."""
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
                    for row in _read_jsonl(metrics_file)[len(history):]:
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
    """:func:`run_rl` in a thread of its own, so that the demo's phases go on beside verl's start-up (the evaluation
    before RL, and on a GPU the warm-up too).

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
                run_rl(cmd, out, tasks, spec.steps, spec.stall_s, env=spec.platform_env(), stop=self._stop)
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
            RLStopped: as :func:`run_rl`.
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


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
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


# ---- the report ---------------------------------------------------------------------------------------


def summarize(before: dict[str, dict[str, EvalResult]], after: dict[str, dict[str, EvalResult]] | None,
              learnable: list[str]) -> dict[str, Any]:
    """Per task and evaluation mode: held-out success and mean reward before RL, and after RL with the change when
    ``after`` exists (a run stopped early has only ``before``)."""
    tasks: dict[str, Any] = {}
    for mode, results in before.items():
        for task, result in results.items():
            row = {"success_before": result.success_rate, "reward_before": result.mean_reward}
            if after is not None:
                post = after[mode][task]
                row.update(success_after=post.success_rate, success_change=post.success_rate - result.success_rate,
                           reward_after=post.mean_reward)
            tasks.setdefault(task, {"learnable": task in learnable, "held_out": len(result.episodes)})[mode] = row
    return tasks


def summary_table(tasks: dict[str, Any]) -> str:
    """A Markdown table of :func:`summarize`'s result, with a note on tasks the tiny model is not expected to learn."""
    lines = ["| task | eval | held-out | success before RL | success after RL | change |",
             "| --- | --- | --- | --- | --- | --- |"]
    for task, row in tasks.items():
        for mode in ("greedy", "sampled"):
            if mode in row:
                r = row[mode]
                after = (f"{r['success_after']:.3f} | {r['success_change']:+.3f}" if "success_after" in r
                         else "- | -")
                lines.append(f"| {task} | {mode} | {row['held_out']} | {r['success_before']:.3f} | {after} |")
    hard = [t for t, row in tasks.items() if not row["learnable"]]
    if hard:
        lines.append("")
        what = "a real AgentBench task family" if len(hard) == 1 else "real AgentBench task families"
        lines.append(f"{', '.join(hard)}: {what}; a 1.6M-parameter model trained for minutes is expected to stay "
                     "near zero there. They are in the run to exercise multi-task training (task-normalised "
                     "advantages) on real environments, not to show learning.")
    return "\n".join(lines)


def plot_learning_curve(path: Path, warmup_history: list[dict[str, float]], rl_history: list[dict[str, Any]],
                        tasks: list[str], held_out: dict[str, Any]) -> None:
    """Warm-up held-out success per step, and RL training success per task per step with held-out before/after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_sft, ax_rl) = plt.subplots(1, 2, figsize=(11, 4))
    ax_sft.plot([h["step"] for h in warmup_history], [h["success"] for h in warmup_history], marker="o")
    ax_sft.set(title="supervised warm-up", xlabel="step", ylabel="held-out greedy success (learnable tasks' mean)",
               ylim=(-0.02, 1.02))
    for task in tasks:
        points = [(row["step"], row["data"][f"agentrl/{task}/success_rate"]) for row in rl_history
                  if f"agentrl/{task}/success_rate" in row["data"]]
        if points:
            line, = ax_rl.plot(*zip(*points, strict=True), label=f"{task} (training episodes)")
            greedy = held_out.get(task, {}).get("greedy")
            if greedy and "success_after" in greedy:
                last = points[-1][0]
                ax_rl.scatter([0, last], [greedy["success_before"], greedy["success_after"]], color=line.get_color(),
                              marker="s", zorder=3, label=f"{task} held-out greedy, before/after")
    ax_rl.set(title="RL (verl main_ppo)", xlabel="step", ylabel="success rate", ylim=(-0.02, 1.02))
    ax_rl.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the command --------------------------------------------------------------------------------------


@dataclass
class DemoProgress:
    """What the demo has measured so far; all of it goes to the summary, also when the demo stops early."""

    out: Path
    config: DemoConfig
    started: float = field(default_factory=time.monotonic)
    timings: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    tasks: list[str] = field(default_factory=list)
    learnable: list[str] = field(default_factory=list)
    demonstrations: int = 0
    warm: WarmupResult | None = None
    warmup_cache: dict[str, Any] | None = None
    """With ``warmup.reuse``: the cached model's ``dir`` and whether it was ``reused`` (else built by this run)."""
    before: dict[str, dict[str, EvalResult]] | None = None
    after: dict[str, dict[str, EvalResult]] | None = None
    command: list[str] = field(default_factory=list)

    def lap(self, name: str, since: float) -> float:
        """Record the phase ``name`` as lasting since ``since``; returns now."""
        now = time.monotonic()
        self.timings[name] = round(now - since, 1)
        return now


def write_summary(progress: DemoProgress, stopped_because: str | None = None) -> dict[str, Any]:
    """Write ``summary.json``, ``summary.md``, ``trajectories.jsonl`` and (once warmed up) ``learning_curve.png``
    with whatever ``progress`` holds; ``stopped_because`` says why a run ended before its last phase."""
    out, config = progress.out, progress.config
    metrics_file = out / "metrics.jsonl"
    rl_history = _read_jsonl(metrics_file) if metrics_file.exists() else []
    progress.timings["total_s"] = round(time.monotonic() - progress.started, 1)
    with open(out / "trajectories.jsonl", "w") as f:
        for phase, results in (("before_rl", progress.before), ("after_rl", progress.after)):
            for mode, per_task in (results or {}).items():
                for result in per_task.values():
                    for episode in result.episodes:
                        f.write(json.dumps({"phase": phase, "eval": mode, **episode}) + "\n")
    per_task = summarize(progress.before, progress.after, progress.learnable) if progress.before else {}
    warm = progress.warm
    files = {"table": "summary.md", "trajectories": "trajectories.jsonl", "rl_rollouts": "rollouts/",
             "rl_log": "verl.log"}
    if warm is not None:
        plot_learning_curve(out / "learning_curve.png", warm.history, rl_history, progress.tasks, per_task)
        files["curve"] = "learning_curve.png"
    if progress.after is not None:
        files["model_after_rl"] = str(exported_actor(out / "checkpoints", config.rl.steps))
    summary = {
        "status": "stopped" if stopped_because else "finished",
        "stopped_because": stopped_because,
        "tasks": per_task,
        "skipped_tasks": progress.skipped,
        "warmup": None if warm is None else {"steps": warm.steps, "held_out_success": warm.success,
                                             "device": warm.device, "history": warm.history,
                                             "demonstrations": progress.demonstrations,
                                             "cache": progress.warmup_cache},
        "rl": {"steps": config.rl.steps, "steps_done": len(rl_history), "command": progress.command,
               "history": rl_history},
        "timings_s": progress.timings,
        "config": asdict(config),
        "files": files,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    head = "# agentrl-verl demo\n\n"
    if stopped_because:
        done = [name.removesuffix("_s") for name in progress.timings if name != "total_s"]
        head += (f"**Stopped early**: {stopped_because}\n\nPhases done: {', '.join(done) or 'none'}; RL steps done: "
                 f"{len(rl_history)}/{config.rl.steps}.\n\n")
    table = summary_table(per_task) if per_task else "(no held-out evaluation yet)"
    (out / "summary.md").write_text(f"{head}{table}\n\n{warmup_line(progress)}Timings (s): "
                                    f"{json.dumps(progress.timings)}\n")
    logger.info("summary (%s):\n%s", out / "summary.json", table)
    return summary


def warmup_line(progress: DemoProgress) -> str:
    """The summary's paragraph on where the warm-up model came from (empty unless ``warmup.reuse`` is on)."""
    cache, warm = progress.warmup_cache, progress.warm
    if cache is None or warm is None:
        return ""
    if not cache["reused"]:
        return f"Warm-up trained by this run and cached in `{cache['dir']}` (`warmup.reuse`).\n\n"
    return (f"Warm-up **reused** from `{cache['dir']}` (`warmup.reuse`): its {warm.steps} steps on "
            f"{progress.demonstrations} demonstrations (held-out greedy success {warm.success:.2f}) ran in an earlier "
            "run; `warmup_s` here is only the lookup.\n\n")


def stop_reason(error: BaseException) -> str:
    """Why the demo ended early, for the summary."""
    if isinstance(error, RLStopped):
        return error.reason.split("; end of ")[0]
    if isinstance(error, KeyboardInterrupt):
        return f"interrupted ({str(error) or 'Ctrl-C'})"
    return f"error: {type(error).__name__}: {str(error)[:500]}"


def run_demo(output_dir: str | os.PathLike, config: DemoConfig) -> dict[str, Any]:
    """Run the whole demo (see the module docstring) and return the summary written to ``summary.json``.

    On any early end (an error, a stalled RL run, Ctrl-C) the summary of what was measured so far is written,
    saying why the demo stopped, and the error is raised again.
    """
    out = Path(output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    progress = DemoProgress(out, config)
    try:
        _run_phases(progress)
    except BaseException as e:
        logger.error("the demo stopped early: %s", stop_reason(e))
        write_summary(progress, stop_reason(e))
        raise
    return write_summary(progress)


def _run_phases(progress: DemoProgress) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_adapters.launcher import EnvStack

    out, config = progress.out, progress.config
    tasks = list(config.tasks)
    if any(t.needs_docker for t in tasks) and not docker_available():
        progress.skipped = {t.name: "no Docker daemon answers" for t in tasks if t.needs_docker}
        tasks = [t for t in tasks if not t.needs_docker]
        logger.warning("Docker is not available: leaving out %s", sorted(progress.skipped))
    learnable = [t for t in tasks if t.learnable]
    progress.tasks, progress.learnable = [t.name for t in tasks], [t.name for t in learnable]
    sessions = {t.name: min(t.concurrency, 64) for t in tasks}

    eval_device = device_setting(config.warmup.device, "warmup.device")
    t = time.monotonic()
    model_dir = tiny_model_path(spec=config.model)  # built after verl's launch, which does not read it

    env_logs = out / "env_logs"
    env_logs.mkdir(exist_ok=True)
    with EnvStack(stack_config(tasks), log_dir=env_logs, startup_timeout=180) as stack:
        logger.info("environment stack at %s: %s (logs in %s)", stack.url, ", ".join(progress.tasks), env_logs)
        indices = asyncio.run(task_indices(stack.url, tasks))
        held_out = {t.name: indices[t.name][: t.held_out] for t in tasks}
        train_indices = {t.name: indices[t.name][t.held_out:] for t in tasks}
        for spec in tasks:
            if not train_indices[spec.name]:
                raise ValueError(f"task {spec.name} has {len(indices[spec.name])} indices, all held out "
                                 f"(held_out: {spec.held_out}); lower held_out")
        t = progress.lap("env_start_s", t)

        # Cold start on the learnable task(s).
        warmup_eval = {s.name: held_out[s.name][: config.eval.warmup_indices] for s in learnable}

        def warmup_success(model, part: slice) -> list[bool]:
            splits = {name: indices[part] for name, indices in warmup_eval.items() if indices[part]}
            results = evaluate_tasks(stack.url, model, tokenizer, splits, config.eval, sessions, seed=config.seed)
            return [episode["success"] for result in results.values() for episode in result.episodes]

        def warm_up(output: Path) -> dict[str, Any]:
            demos = [d for spec in learnable
                     for d in generate_demonstrations(spec.family, train_indices[spec.name][
                         : spec.demonstration_count(config.demonstrations)], spec.options)]
            progress.demonstrations = len(demos)
            logger.info("generated %d demonstrations (%s)", len(demos), ", ".join(progress.learnable))
            warm = supervised_warmup(model_dir, demos, output, warmup_success, config.warmup)
            return {**{k: v for k, v in asdict(warm).items() if k != "path"}, "demonstrations": len(demos)}

        def evaluate_all(path: str | Path) -> dict[str, dict[str, EvalResult]]:
            # Where the warm-up trains (on a GPU, the CPU's cores stay with verl's processes beside it).
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(eval_device)
            results = {"greedy": evaluate_tasks(stack.url, model, tokenizer, held_out, config.eval, sessions,
                                                seed=config.seed)}
            if config.eval.sampled:
                results["sampled"] = evaluate_tasks(stack.url, model, tokenizer, held_out, config.eval, sessions,
                                                    greedy=False, seed=config.seed)
            for mode, per_task in results.items():
                logger.info("held-out %s success: %s", mode,
                            ", ".join(f"{k} {v.success_rate:.3f}" for k, v in per_task.items()))
            return results

        # The warm-up model's directory is known before it exists, and appears whole (build_whole): where the warm-up
        # trains on a GPU, verl's run starts first (rl.start_with_warmup) and its start-up - processes importing verl
        # one after another - overlaps the warm-up, its trainer waiting for the model (agentrl.start_model_wait_s).
        # Everywhere, the evaluation before RL plays beside that start-up.
        settings, cache_root = warmup_settings(model_dir, config, tasks), default_cache_dir() / "demo"
        if config.warmup.reuse:
            warm_path = cache_path(cache_root, "warmup", settings)
        else:
            warm_path = out / "warmup_model"
            shutil.rmtree(warm_path, ignore_errors=True)  # an earlier run's, in the same output directory
        early = config.rl.starts_with_warmup(config.warmup.device)
        batch = int(OmegaConf.select(rl_preset_values(config.rl), "data.train_batch_size"))
        train_file, val_file = write_datasets(out / "data", train_indices, held_out,
                                              {t.name: t.weight for t in tasks}, config.rl.steps * batch, config.seed)
        ray_dir = Path(tempfile.mkdtemp(prefix="agentrl-demo-ray-", dir="/tmp"))  # short: Ray's socket path limit
        progress.command = rl_command(str(warm_path), train_file, val_file, stack.url, out, ray_dir, config.rl,
                                      config.seed, start_model_wait_s=config.rl.stall_s if early else 0.0)
        rl = RLRun(progress.command, out, progress.tasks, config.rl)
        try:
            if early:
                rl.start()
            build_tiny_model(spec=config.model)
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            t = progress.lap("build_model_s", t)
            if config.warmup.reuse:
                cached = cached_warmup(cache_root, "warmup", settings, warm_up)
                done = cached.metadata
                progress.warmup_cache = {"dir": str(cached.path), "reused": cached.reused}
                if cached.reused:
                    logger.info("warm-up: reused the cached model %s (no demonstrations, no training)", cached.path)
            else:
                done = build_whole(warm_path, warm_up)
            progress.demonstrations = done.pop("demonstrations")
            progress.warm = warm = WarmupResult(path=str(warm_path), **done)
            logger.info("warm-up: %d steps on %s, held-out greedy success %.2f", warm.steps, warm.device,
                        warm.success)
            t = progress.lap("warmup_s", t)
            if not early:
                rl.start()
            progress.before = evaluate_all(warm.path)
            progress.lap("eval_before_s", t)
            rl.wait()
        except BaseException:
            rl.stop()
            raise
        finally:
            shutil.rmtree(ray_dir, ignore_errors=True)
        t = progress.lap("rl_s", rl.started)

        progress.after = evaluate_all(exported_actor(out / "checkpoints", config.rl.steps))
        progress.lap("eval_after_s", t)


def rl_preset_values(spec: RLSpec, *extra: str):
    """The composed RL preset with ``spec``'s overrides and ``extra`` (for values the demo needs up front, e.g. the
    batch size)."""
    from hydra import compose, initialize_config_dir

    from agentrl_verl.harness.presets import CONFIG_DIR

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default="outputs/demo", help="where results go (default outputs/demo)")
    parser.add_argument("--config", default=None, help="demo settings YAML (default: the embedded demo_run.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a demo setting, e.g. --set rl.steps=20 (repeatable)")
    parser.add_argument("--rl-override", dest="rl_overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override of the verl run, e.g. actor_rollout_ref.actor.optim.lr=2e-4")
    parser.add_argument("--engine", choices=sorted(ENGINES), default=None,
                        help="rollout engine of the verl run (default hf; vllm needs `bash scripts/setup.sh --vllm`)")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    config = load_demo_config(args.config, args.overrides)
    config.rl.overrides = [*config.rl.overrides, *args.rl_overrides]
    if args.engine:
        config.rl.engine = args.engine
    if config.rl.resolved_device() == "cpu":  # a shared CPU machine's thread settings (harness/threads.py)
        relaunch_with_demo_threads()
    # Ctrl-C and SIGTERM unwind through the finally blocks that stop the stack and the verl run. SIGINT is set
    # explicitly because a process started in the background by a non-interactive shell inherits it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    check_rl_settings(config.rl)  # a bad agentrl.* override stops here, not after the warm-up
    summary = run_demo(args.output_dir, config)
    logger.info("done in %.0fs; results in %s", summary["timings_s"]["total_s"], Path(args.output_dir).resolve())
    print(headline(summary))
    return 0


def headline(summary: dict[str, Any]) -> str:
    """The command's result line: held-out success before/after RL per task and mode, and the total time."""
    pairs = {f"{task}_{mode}_{when}": row[mode][f"success_{when}"] for task, row in summary["tasks"].items()
             for mode in ("greedy", "sampled") if mode in row for when in ("before", "after")}
    return " ".join([*(f"{k}={v:.3f}" for k, v in pairs.items()), f"total_s={summary['timings_s']['total_s']:.0f}"])
