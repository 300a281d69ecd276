"""Synchronous vs asynchronous AgentRL training on one workload: ``python -m bench.async_vs_sync``.

Both runs are verl's real ``main_ppo`` on CPU (``cpu_tiny`` preset, the ``agentrl_agent`` loop, ``task_norm_grpo``)
against the same environment stack, from the same warmed-up model, with the same seed, data, batch and number of
steps (so the same number of trained trajectories), on ``calc`` with a heavy-tailed environment latency per step
(lognormal, capped); ``--tasks calc db`` adds the real ``db`` task (DBBench on SQLite), which the warmed-up tiny model
never solves: its groups carry no gradient and only slow both runs.

The synchronous run is ``trainer.v1.trainer_mode=agentrl_sync``; the asynchronous one ``agentrl_async`` with
``agentrl.async.max_staleness=K``. Both take the PPO ratio against the log-probs of the policy that generated each
token (``--correction bypass``): without it verl recomputes ``old_log_probs`` with the current actor, and turns that
are K updates old are trained as if on-policy. The training time of a run is the sum of verl's per-step wall times
(``timing_s/step``: the step from its start, waiting for the batch included, to the weight update); process
start-up (Ray, workers, model loading) and the final checkpoint save are the same for both and left out. Right after
its two runs, a pair evaluates both final models on held-out calc problems (sampled at the runs' temperature); the
start model is evaluated once on the same problems.

The start model (the demo's supervised warm-up of the tiny model on calc) is built once and cached under
``$AGENTRL_CACHE_DIR``. ``--seeds 0 1 2 3 4`` runs one pair per seed (``--parallel P`` pairs at once, each in its own
process, for machines with more cores; ``--pin`` gives each its own cores) and writes ``summary.md``,
``summary.json`` and ``pairs.png`` to ``--out``.
Each seed's ``pair.json`` is written after its training and again after its evaluation, so a run that was cut off
resumes with the same command: evaluated pairs are kept, trained ones whose models are still there are only evaluated,
the others run again.
The last line printed is ``key=value`` pairs: mean speedup (sync training time / async training time) and held-out
success of each arm with their standard errors over seeds, the paired difference, and the async runs' staleness.

The same comparison on the real families (calc, kg, webshop and alfworld at the multi-task demo's settings, no
synthetic delay) is ``python -m bench.ablation --arms full sync``.

Results and how to read them: ``docs/training/async.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from agentrl_verl.harness.threads import relaunch_with_demo_threads
from agentrl_verl.pipeline.launch import exported_actor, read_jsonl, rl_command, run_main_ppo
from agentrl_verl.pipeline.settings import RLSpec, TaskSpec, load_pipeline_config
from agentrl_verl.pipeline.stack import Split, task_indices
from agentrl_verl.pipeline.stack import stack_config as tasks_stack_config
from agentrl_verl.pipeline.warmup import plan_warmup, warm_up
from agentrl_verl.tools.cli import main as agentrl_verl_cli
from agentrl_verl.tools.evaluate import evaluate_model
from bench.common import cpu_affinity, cpu_list, cpu_shares, mean_and_se, run_processes, saved_record
from env_adapters.launcher import EnvStack

logger = logging.getLogger("bench.async_vs_sync")

MODES = {"sync": "agentrl_sync", "async": "agentrl_async"}
"""The two arms: short name -> ``trainer.v1.trainer_mode``."""
TASKS = ("calc", "db")
"""Task families the runs may train on (``--tasks``)."""
CORRECTIONS = {
    # PPO ratio against each token's behaviour log-prob, clipped (upstream AgentRL's behaviour; the demo's layer).
    "bypass": ["algorithm.rollout_correction.bypass_mode=true"],
    # verl's decoupled mode with truncated token-level importance weights against the behaviour log-probs.
    "token": ["algorithm.rollout_correction.bypass_mode=false", "algorithm.rollout_correction.rollout_is=token"],
    # verl's default: old_log_probs recomputed by the current actor, stale turns trained as on-policy.
    "none": ["algorithm.rollout_correction.bypass_mode=false"],
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8,
                        help="training steps of each run (the speedup grows with the steps: the first fills the "
                             "pipeline; docs/training/async.md's figures use 28)")
    parser.add_argument("--batch", type=int, default=4, help="groups (prompts) per step, data.train_batch_size")
    parser.add_argument("--n", type=int, default=4, help="trajectories per group, rollout.n")
    parser.add_argument("--max-staleness", type=int, default=3, help="agentrl.async.max_staleness of the async run")
    parser.add_argument("--stale-policy", default="wait", choices=["wait", "drop", "keep"])
    parser.add_argument("--tasks", nargs="+", default=["calc"], choices=list(TASKS),
                        help="task families of the training prompts, equal shares (calc gets the latency below)")
    parser.add_argument("--correction", default="bypass", choices=sorted(CORRECTIONS),
                        help="off-policy correction of both runs (see the module docstring)")
    parser.add_argument("--latency-median-s", type=float, default=0.5, help="median calc step latency")
    parser.add_argument("--latency-sigma", type=float, default=1.2, help="lognormal sigma of the calc step latency")
    parser.add_argument("--latency-max-s", type=float, default=10.0, help="cap of the calc step latency")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="one sync/async pair per seed (data order, sampling, training calc problems)")
    parser.add_argument("--parallel", type=int, default=1, help="pairs run at once, each in its own process")
    parser.add_argument("--arms-at-once", action="store_true",
                        help="run each pair's sync and async run at the same time (for machines with idle cores: "
                             "where they saturate the CPU they slow each other, the async run most, and the speedup "
                             "is understated)")
    parser.add_argument("--pin", action="store_true",
                        help="give each of the --parallel pairs an equal share of the CPUs this process may use, and "
                             "with --arms-at-once each run half of its pair's share (CPU affinity, which the run's "
                             "Ray workers inherit; a pair's environment stacks and evaluation use its whole share): no "
                             "run waits for another's cores")
    parser.add_argument("--model", default=None,
                        help="model directory used as is (default: the tiny offline model after the demo's supervised "
                             "warm-up on calc, cached, so that rewards can move)")
    parser.add_argument("--out", default=None, help="folder for logs, metrics and the summary (default: a temporary)")
    parser.add_argument("--stall-s", type=float, default=900.0,
                        help="a training run that neither finishes a step nor prints a line for this long is stopped")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override for both runs (repeatable), e.g. actor_rollout_ref.actor.optim.lr=5e-5")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: summarise the seeds' folders already under --out (a pair whose evaluation "
                             "did not finish counts for speed and training only)")
    parser.add_argument("--eval-size", type=int, default=100,
                        help="held-out calc episodes, sampled at the runs' temperature, the same for every model: the "
                             "start model (once) and each run's final model (0: no evaluation)")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel {args.parallel}: must be >= 1")
    if args.report and not args.out:
        parser.error("--report summarises the runs under --out: name it")
    if len(set(args.tasks)) < len(args.tasks):
        parser.error(f"--tasks {' '.join(args.tasks)}: each task once")
    if args.pin and not hasattr(os, "sched_setaffinity"):
        parser.error("--pin needs CPU affinity (Linux)")
    return args


def stack_config(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The training environment stack of one run: a worker per task of ``--tasks``."""
    latency = {"dist": "lognormal", "median_s": args.latency_median_s, "sigma": args.latency_sigma,
               "max_s": args.latency_max_s}
    options = {"calc": {"size": CALC_SIZE, "seed": seed, "step_latency": latency}, "db": {"backend": "sqlite"}}
    concurrency = (args.max_staleness + 2) * args.batch * args.n  # never the bottleneck of either mode
    return {
        "controller": {"port": 0},
        "workers": [{"task": task, "name": task, "concurrency": concurrency, "options": options[task]}
                    for task in args.tasks],
    }



CALC_SIZE = 256
"""calc indices the runs train on; the warm-up demonstrates and evaluates on the indices after them, and the final
held-out evaluation uses the indices after those."""
DEMO = load_pipeline_config()
"""The demo's settings: its warm-up, its evaluation and its RL temperature are the bench's too."""


def calc_stack(seed: int, size: int) -> EnvStack:
    """An environment stack serving calc without latency, for the evaluations (warm-up checks, held-out success)."""
    return EnvStack({"controller": {"port": 0}, "workers": [
        {"task": "calc", "name": "calc", "concurrency": 64, "options": {"seed": seed, "size": size}}]})


def calc_successes(env_url: str, model, tokenizer, indices: list[int], seed: int, greedy: bool = True) -> list[bool]:
    """Success of each episode of ``model`` on calc ``indices`` served at ``env_url``, played with the training agent
    loop and the demo's evaluation settings: greedy, or sampled at the runs' temperature (seeded)."""
    spec = DEMO.eval
    results = evaluate_model(env_url, model, tokenizer, {"calc": indices}, greedy=greedy, temperature=spec.temperature,
                             max_turns=spec.max_turns, max_new_tokens=spec.max_new_tokens,
                             max_context=spec.max_context, concurrency=64, seed=seed)
    return [episode["success"] for episode in results["calc"].episodes]


def held_out_success(models: dict[str, Path], start: Path, size: int) -> dict[str, float]:
    """Sampled success of each model on the held-out calc problems: ``size`` indices of the warm-up's problem seed
    after those the warm-up demonstrated and checked on (the runs train on indices below :data:`CALC_SIZE`), played
    with the same sampling seed for every model and pair. ``start``: the start model, whose tokenizer RL keeps."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    first = CALC_SIZE + DEMO.eval.warmup_indices + DEMO.demonstrations
    indices = list(range(first, first + size))
    tokenizer = AutoTokenizer.from_pretrained(start)
    results = {}
    with calc_stack(DEMO.seed, indices[-1] + 1) as stack:
        for name, path in models.items():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            outcomes = calc_successes(stack.url, model, tokenizer, indices, DEMO.seed, greedy=False)
            results[name] = sum(outcomes) / len(outcomes)
            logger.info("held-out calc success (%d episodes, sampled) of the %s model: %.3f", len(indices), name,
                        results[name])
    return results


def start_held_out(workdir: Path, model: Path | None, size: int) -> float | None:
    """Held-out success of the start model on ``size`` episodes, evaluated once per ``--out`` folder and kept in its
    ``start.json``; without ``model`` (``--report``) only what that file holds, and None without evaluation."""
    path = workdir / "start.json"
    saved = json.loads(path.read_text()) if path.exists() else None
    if saved is not None and (model is None or (saved["model"], saved["episodes"]) == (model.name, size)):
        return saved["success"]
    if model is None or size == 0:
        return None
    success = held_out_success({"start": model}, model, size)["start"]
    path.write_text(json.dumps({"model": model.name, "episodes": size, "success": success}))
    return success


WARMUP_TASK = TaskSpec(name="calc", family="calc", options={"seed": DEMO.seed,
                                                          "size": DEMO.eval.warmup_indices + DEMO.demonstrations},
                       concurrency=64, held_out=DEMO.eval.warmup_indices, learnable=True)
"""The warm-up's calc problems (seed ``DEMO.seed``, no latency): the first ``eval.warmup_indices`` check it, the
rest are demonstrated. The final held-out evaluation plays indices after all of them."""


def warmed_up_model() -> Path:
    """The tiny model after the pipeline's supervised warm-up on calc (:func:`warm_up` with the demo's settings, on
    :data:`WARMUP_TASK`), built once and kept under ``$AGENTRL_CACHE_DIR/async_vs_sync/``.

    An untrained model ends every episode with a malformed first turn: a flat reward, and episodes that never
    reach the multi-turn latency tail. Every seed of the bench starts from this one model, so pairs differ only in
    the training mode.
    """
    from agentrl_verl.models.cache import default_cache_dir

    tasks = [WARMUP_TASK]
    plan = plan_warmup(DEMO.model.build(), DEMO, tasks, default_cache_dir() / "async_vs_sync")
    if not (plan.path / "config.json").exists():
        logger.info("warm-up: supervised, on calc")
        with EnvStack(tasks_stack_config(tasks)) as stack:
            warm_up(plan, stack.url, Split.of(asyncio.run(task_indices(stack.url, tasks)), tasks))
    return plan.path


def run_training(mode: str, args: argparse.Namespace, seed: int, workdir: Path, model: Path, env_url: str,
                 stop: threading.Event | None = None, cpus: set[int] | None = None) -> dict[str, Any]:
    """One ``main_ppo`` run (``mode``: ``sync`` or ``async``) in ``workdir/mode``, launched and supervised as the
    demo's (:func:`run_main_ppo`), each step logged as it ends; returns its per-step metrics, process wall time and
    final model (its HF export). Setting ``stop`` ends the run (with an error); ``cpus``: the CPUs the run and its
    Ray workers may use (default: this process's)."""
    out = workdir / mode
    out.mkdir(exist_ok=True)
    overrides = [
        f"data.train_batch_size={args.batch}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        f"actor_rollout_ref.rollout.n={args.n}", f"trainer.v1.trainer_mode={MODES[mode]}",
        # The demo's layer minus what this comparison leaves out: cross-policy sampling, the demo's token limits.
        "agentrl.cross_policy.enable=false", "agentrl.agent.max_total_tokens=1024", "data.max_prompt_length=768",
        f"agentrl.async.max_staleness={args.max_staleness}", f"+agentrl.async.stale_policy={args.stale_policy}",
        *CORRECTIONS[args.correction], *args.override,
    ]
    spec = RLSpec(steps=args.steps, stall_s=args.stall_s, overrides=overrides, device="cpu")
    ray_dir = Path(tempfile.mkdtemp(prefix="bray_", dir="/tmp"))  # short: Ray's socket paths have a length limit
    start = time.monotonic()
    try:
        cmd = rl_command(str(model), workdir / "train.parquet", workdir / "val.parquet", env_url, out, ray_dir, spec,
                         seed)
        with cpu_affinity(cpus):  # the run's processes inherit it
            run_main_ppo(cmd, out, list(args.tasks), args.steps, spec.stall_s, env=spec.platform_env(),
                         stop=stop)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    return {"wall_s": time.monotonic() - start, "steps": _read_steps(out / "metrics.jsonl"),
            "model": exported_actor(out / "checkpoints", args.steps)}


def _read_steps(path: Path) -> dict[int, dict[str, Any]]:
    return {int(row["step"]): row["data"] for row in read_jsonl(path)} if path.exists() else {}


DIAGNOSTICS = {
    "turn_lag_mean": "async/staleness/turn_lag/mean",
    "turn_lag_max": "async/staleness/turn_lag/max",
    "multi_version": "async/staleness/multi_version_trajectories",
    "versions_per_trajectory": "async/staleness/versions_per_trajectory/mean",
    "rollout_idle": "async/rollout_idle_fraction",
    "trainer_idle": "async/trainer_idle_fraction",
    "resumed_turns": "async/resumed_turns",
    "dropped": "async/groups/dropped",
    "stale_kept": "async/groups/stale_kept",
    "clipfrac": "actor/pg_clipfrac",
    "ppo_kl": "actor/ppo_kl",
    "behaviour_kl": "rollout_corr/kl",  # trained policy vs the one that generated each token (bypass mode)
}
"""Per-step metrics averaged over a run's steps (``turn_lag_max``: the largest) to explain its learning; a key also
matches under a prefix (``actor/rollout_corr/kl``)."""


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    """Training time, trajectories (all and calc), rewards per step and :data:`DIAGNOSTICS` of one run."""
    steps = [run["steps"][k] for k in sorted(run["steps"])]
    # The last step saves the final model for the evaluation: not training time.
    step_s = [float(m["timing_s/step"]) - float(m.get("timing_s/save_checkpoint", 0.0)) for m in steps]
    diagnostics = {}
    for name, key in DIAGNOSTICS.items():
        values = [float(value) for m in steps for k, value in m.items() if k == key or k.endswith(f"/{key}")]
        if values:
            diagnostics[name] = max(values) if name == "turn_lag_max" else sum(values) / len(values)
    return {
        "train_s": sum(step_s),
        "startup_s": run["wall_s"] - sum(step_s),
        # Before step 1, the trainer waits for verl's agent loop workers to start (start-up, like the others').
        "agent_loop_ready_s": float(steps[0].get("agentrl/agent_loop_ready_s", 0.0)) if steps else 0.0,
        "trajectories": sum(float(m.get("agentrl/all/episodes", 0)) for m in steps),
        "calc_trajectories": sum(float(m.get("agentrl/calc/episodes", 0)) for m in steps),
        "reward": [round(float(m.get("agentrl/all/reward", float("nan"))), 3) for m in steps],
        "calc_reward": [round(float(m.get("agentrl/calc/reward", float("nan"))), 3) for m in steps],
        "step_s": [round(t, 2) for t in step_s],
        "model": str(run["model"]),
        "diagnostics": diagnostics,
    }


def pair_settings(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """What a pair's training depends on besides its seed; a ``pair.json`` made with other settings is not resumed."""
    return {"steps": args.steps, "batch": args.batch, "n": args.n, "tasks": args.tasks,
            "max_staleness": args.max_staleness, "stale_policy": args.stale_policy, "correction": args.correction,
            "latency": [args.latency_median_s, args.latency_sigma, args.latency_max_s], "overrides": args.override,
            "arms_at_once": args.arms_at_once, "pin": args.pin, "model": model.name}


def pair_done(pair: dict[str, Any] | None, eval_size: int) -> bool:
    """Whether a saved pair needs nothing more: trained, and evaluated on ``eval_size`` episodes unless that is 0."""
    return pair is not None and (eval_size == 0 or pair["held_out_episodes"] == eval_size)


def write_pair(workdir: Path, record: dict[str, Any], runs: dict[str, Any], settings: dict[str, Any]) -> None:
    """Write ``pair.json`` whole or not at all (a run cut off while writing leaves the previous one)."""
    partial = workdir / "pair.json.tmp"
    partial.write_text(json.dumps({**record, "settings": settings, "runs": runs}, indent=2))
    partial.replace(workdir / "pair.json")


def train_pair(args: argparse.Namespace, seed: int, workdir: Path, model: Path) -> dict[str, dict[str, Any]]:
    """The sync and the async run of one seed, one after the other or (``--arms-at-once``) at the same time, each
    against its own fresh environment stack (so both see the same calc latencies): ``mode -> summarise(run)``."""
    with contextlib.ExitStack() as stacks:
        urls = {}
        for mode in MODES:
            logs = workdir / "env_logs" / mode
            logs.mkdir(parents=True, exist_ok=True)
            urls[mode] = stacks.enter_context(EnvStack(stack_config(args, seed), log_dir=logs)).url
        rows = (args.steps + args.max_staleness + 2) * args.batch  # the async run admits up to K + 1 batches ahead
        code = agentrl_verl_cli(["make-data", "--controller", urls["sync"], "--out", str(workdir),
                                 "--train-size", str(rows), "--val-fraction", "0.1", "--seed", str(seed)])
        if code != 0:
            raise RuntimeError(f"make-data failed with exit code {code}")

        # --pin with both runs at once: each run on half of this pair's CPUs.
        cpus = (dict(zip(MODES, cpu_shares(os.sched_getaffinity(0), len(MODES)), strict=True))
                if args.pin and args.arms_at_once else {})

        def train(mode: str, stop: threading.Event | None = None) -> dict[str, Any]:
            logger.info("seed %d: %s run (%d steps of %d x %d trajectories)%s", seed, mode, args.steps, args.batch,
                        args.n, f" on CPUs {cpu_list(cpus[mode])}" if mode in cpus else "")
            return summarise(run_training(mode, args, seed, workdir, model, urls[mode], stop, cpus=cpus.get(mode)))

        if not args.arms_at_once:
            return {mode: train(mode) for mode in MODES}
        stop = threading.Event()
        with ThreadPoolExecutor(len(MODES)) as pool:
            futures = {mode: pool.submit(train, mode, stop) for mode in MODES}
            try:
                done, _ = wait(futures.values(), return_when=FIRST_EXCEPTION)
            finally:
                stop.set()  # a run failed or this thread was interrupted: the other run ends too
            for future in done:
                future.result()  # raises the first failure, rather than the other run's "stopped"
            return {mode: future.result() for mode, future in futures.items()}


def run_pair(args: argparse.Namespace, seed: int, workdir: Path, model: Path) -> dict[str, Any]:
    """One seed's pair, resumed from its folder: a pair already done is returned as is, a trained one whose final
    models are still there is only evaluated, any other is trained. ``pair.json`` is written after the training and
    again after the held-out evaluation of both final models; returns its :func:`pair_record`."""
    settings = pair_settings(args, model)
    saved = saved_record(workdir / "pair.json", settings)
    if pair_done(saved, args.eval_size):
        logger.info("seed %d: done before, kept (%s)", seed, workdir / "pair.json")
        return saved
    if saved is not None and all(Path(run["model"], "config.json").exists() for run in saved["runs"].values()):
        logger.info("seed %d: trained before, evaluating its models", seed)
        runs = saved["runs"]
    else:
        runs = train_pair(args, seed, workdir, model)
        write_pair(workdir, pair_record(seed, runs, {}), runs, settings)
    held_out = {}
    if args.eval_size > 0:
        held_out = held_out_success({mode: Path(runs[mode]["model"]) for mode in MODES}, model, args.eval_size)
    record = pair_record(seed, runs, held_out, args.eval_size if held_out else 0)
    write_pair(workdir, record, runs, settings)
    logger.info("seed %d: %s", seed, json.dumps(record))
    return record


def pair_record(seed: int, runs: dict[str, dict[str, Any]], held_out: dict[str, float],
                held_out_episodes: int = 0) -> dict[str, Any]:
    """The figures of one pair: speedup, trajectories, held-out success of the final models (``held_out_episodes``
    each; 0: not evaluated) and the runs' diagnostics."""
    sync, asynchronous = runs["sync"], runs["async"]
    return {
        "seed": seed,
        "speedup": sync["train_s"] / asynchronous["train_s"],
        # Step 1 holds each run's first generations (model warm-up, prefix caches, env sessions) and, in the async
        # run, the filling of the pipeline.
        "speedup_after_step1": sum(sync["step_s"][1:]) / max(sum(asynchronous["step_s"][1:]), 1e-9),
        # As if the agent loop workers' start-up were training time (the trainers did not always wait for it).
        "speedup_with_agent_loop_start": ((sync["train_s"] + sync.get("agent_loop_ready_s", 0.0))
                                          / (asynchronous["train_s"] + asynchronous.get("agent_loop_ready_s", 0.0))),
        "sync_train_s": sync["train_s"], "async_train_s": asynchronous["train_s"],
        "trajectories": {mode: run["trajectories"] for mode, run in runs.items()},
        "calc_trajectories": {mode: run["calc_trajectories"] for mode, run in runs.items()},
        "reward_mean": {mode: sum(run["reward"]) / max(len(run["reward"]), 1) for mode, run in runs.items()},
        "held_out": held_out,
        "held_out_episodes": held_out_episodes,
        "diagnostics": {mode: run["diagnostics"] for mode, run in runs.items()},
    }


def load_pairs(folders: dict[int, Path]) -> list[dict[str, Any]]:
    """The saved pairs of ``seed -> folder`` (``--report``); seeds whose training did not finish are left out.

    Raises:
        FileNotFoundError: no seed has a finished training.
    """
    pairs = []
    for seed, folder in folders.items():
        if (folder / "pair.json").exists():
            pairs.append(json.loads((folder / "pair.json").read_text()))
        else:
            logger.warning("seed %d: no pair.json in %s (its training did not finish): left out", seed, folder)
    if not pairs:
        raise FileNotFoundError(f"no pair.json in {', '.join(map(str, folders.values()))}: nothing to report")
    return pairs


def paired_statistics(pairs: Sequence[dict[str, Any]], start: float | None = None) -> dict[str, Any]:
    """Across seeds: each arm's mean held-out success and standard error, the paired difference (async - sync)
    and its standard error, whether async is within one standard error of sync, and the speedups; ``start``: the
    start model's held-out success (one evaluation, the same for every seed), if known.

    Pairs without held-out success (evaluation not run or not finished) count for the speedups only.
    "Within one standard error" (``None`` with fewer than two evaluated pairs) compares the mean paired difference
    with its own standard error (the seeds pair the runs: same start model, data and problems), i.e.
    ``mean(async - sync) >= -se(async - sync)``.
    """
    stats: dict[str, Any] = {"seeds": [p["seed"] for p in pairs]}
    speedup = mean_and_se([p["speedup"] for p in pairs])
    stats.update(speedup_mean=speedup[0], speedup_se=speedup[1], speedup_min=min(p["speedup"] for p in pairs),
                 speedup_after_step1_mean=mean_and_se([p["speedup_after_step1"] for p in pairs])[0])
    if all("speedup_with_agent_loop_start" in p for p in pairs):
        stats["speedup_with_agent_loop_start_mean"] = mean_and_se(
            [p["speedup_with_agent_loop_start"] for p in pairs])[0]
    if start is not None:
        stats["held_out_start"] = start
    evaluated = [p for p in pairs if {"sync", "async"} <= set(p["held_out"])]
    if evaluated:
        for arm in ("sync", "async"):
            stats[f"held_out_{arm}"], stats[f"held_out_{arm}_se"] = mean_and_se([p["held_out"][arm] for p in evaluated])
        diff = mean_and_se([p["held_out"]["async"] - p["held_out"]["sync"] for p in evaluated])
        stats.update(held_out_pairs=len(evaluated), held_out_diff=diff[0], held_out_diff_se=diff[1],
                     async_lower_pairs=sum(p["held_out"]["async"] < p["held_out"]["sync"] for p in evaluated),
                     # One pair has no standard error to be within.
                     async_within_one_se=diff[0] >= -diff[1] if len(evaluated) > 1 else None)
    return stats


def summary_markdown(pairs: Sequence[dict[str, Any]], stats: dict[str, Any], settings: str) -> str:
    """A Markdown report: one row per seed, then the means with their standard errors."""
    def cell(pair: dict[str, Any], arm: str) -> str:
        value = pair["held_out"].get(arm)
        return "-" if value is None else f"{value:.3f}"

    def diag(pair: dict[str, Any], name: str) -> str:
        value = pair["diagnostics"].get("async", {}).get(name)
        return "-" if value is None else f"{value:.3f}" if name == "clipfrac" else f"{value:.2f}"

    lines = [f"# bench.async_vs_sync\n\n{settings}\n",
             "| seed | speedup | sync s | async s | held-out sync | async | async - sync "
             "| calc traj. sync / async | async turn lag mean | multi-version traj. | async clipfrac | sync clipfrac |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in pairs:
        held = p["held_out"]
        diff = f"{held['async'] - held['sync']:+.3f}" if {"sync", "async"} <= set(held) else "-"
        sync_clip = p["diagnostics"].get("sync", {}).get("clipfrac")
        lines.append(
            f"| {p['seed']} | {p['speedup']:.2f} | {p['sync_train_s']:.0f} | {p['async_train_s']:.0f} "
            f"| {cell(p, 'sync')} | {cell(p, 'async')} | {diff} "
            f"| {p['calc_trajectories']['sync']:.0f} / {p['calc_trajectories']['async']:.0f} "
            f"| {diag(p, 'turn_lag_mean')} | {diag(p, 'multi_version')} | {diag(p, 'clipfrac')} "
            f"| {'-' if sync_clip is None else f'{sync_clip:.3f}'} |")
    lines.append("")
    with_start = stats.get("speedup_with_agent_loop_start_mean")
    lines.append(f"Speedup {stats['speedup_mean']:.2f} +- {stats['speedup_se']:.2f} (min {stats['speedup_min']:.2f}; "
                 f"{stats['speedup_after_step1_mean']:.2f} without each run's first step"
                 + ("" if with_start is None else
                    f"; {with_start:.2f} counting the agent loop workers' start-up as training time") + ").")
    if "held_out_start" in stats:
        lines.append(f"Held-out success of the start model: {stats['held_out_start']:.3f}.")
    if "held_out_diff" in stats:
        verdict = {True: "within", False: "not within", None: "too few pairs for"}[stats["async_within_one_se"]]
        lines.append(
            f"Held-out success over {stats['held_out_pairs']} evaluated seeds: "
            f"sync {stats['held_out_sync']:.3f} +- {stats['held_out_sync_se']:.3f}, "
            f"async {stats['held_out_async']:.3f} +- {stats['held_out_async_se']:.3f}; paired difference "
            f"{stats['held_out_diff']:+.3f} +- {stats['held_out_diff_se']:.3f} "
            f"({verdict} one standard error; async lower in {stats['async_lower_pairs']} of "
            f"{stats['held_out_pairs']} pairs).")
    return "\n".join(lines) + "\n"


def plot_pairs(pairs: Sequence[dict[str, Any]], start: float | None, path: Path) -> None:
    """Held-out success of each seed's sync and async model (and the start model's), and each pair's speedup."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_success, ax_speed) = plt.subplots(1, 2, figsize=(10, 4))
    arms = ["sync", "async"]
    for p in pairs:
        values = [p["held_out"].get(arm, float("nan")) for arm in arms]
        ax_success.plot(arms, values, marker="o", label=f"seed {p['seed']}")
    if start is not None:
        ax_success.axhline(start, color="grey", linestyle="--", linewidth=1, label="start model")
    ax_success.set(title="held-out calc success (sampled)", ylabel="success rate")
    ax_success.legend(fontsize=7)
    ax_speed.bar([str(p["seed"]) for p in pairs], [p["speedup"] for p in pairs])
    ax_speed.axhline(2.5, color="grey", linestyle="--", linewidth=1)
    ax_speed.set(title="speedup (sync / async training time)", xlabel="seed")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_children(args: argparse.Namespace, argv: Sequence[str], workdir: Path, model: Path) -> list[dict[str, Any]]:
    """Run each seed's pair in its own process (``--parallel`` at once), except pairs already done under
    ``workdir``; returns their records in seed order.

    A child gets this command line with its own ``--seeds``, ``--out`` and ``--model`` (the last occurrence of an
    option wins) and ``--parallel 1``; it resumes its pair (:func:`run_pair`).
    """
    settings = pair_settings(args, model)
    pending = [seed for seed in args.seeds
               if not pair_done(saved_record(workdir / f"seed_{seed}" / "pair.json", settings), args.eval_size)]
    if len(pending) < len(args.seeds):
        logger.info("seeds %s: done before, kept", sorted(set(args.seeds) - set(pending)))
    commands = {}
    for seed in pending:
        out = workdir / f"seed_{seed}"
        out.mkdir(parents=True, exist_ok=True)
        commands[f"seed {seed}"] = ([sys.executable, "-m", "bench.async_vs_sync", *argv, "--seeds", str(seed),
                                     "--out", str(out), "--model", str(model), "--parallel", "1"], out / "bench.log")
    failed = run_processes(commands, args.parallel, args.pin, stop_s=30)
    if failed:
        raise RuntimeError(f"{', '.join(failed)} failed; see {workdir}/seed_*/bench.log")
    return [json.loads((workdir / f"seed_{seed}" / "pair.json").read_text()) for seed in args.seeds]


def main(argv: Sequence[str] | None = None) -> int:
    # force: importing verl already gave the root logger a WARNING-level handler.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    # A timeout's SIGTERM unwinds like Ctrl-C: verl runs, children and environment stacks are stopped on the way.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = Path(args.out or tempfile.mkdtemp(prefix="async_vs_sync_")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    folders = {seed: workdir if len(args.seeds) == 1 else workdir / f"seed_{seed}" for seed in args.seeds}
    if args.report:
        pairs = load_pairs(folders)
        start = start_held_out(workdir, None, args.eval_size)
    else:
        model = Path(args.model).resolve() if args.model else warmed_up_model()
        if len(args.seeds) > 1 and args.parallel > 1:
            pairs = run_children(args, argv, workdir, model)
        else:
            pairs = [run_pair(args, seed, folder, model) for seed, folder in folders.items()]
        start = start_held_out(workdir, model, args.eval_size)
    stats = paired_statistics(pairs, start)
    settings = (f"{args.steps} steps of {args.batch} groups x {args.n} ({' + '.join(args.tasks)}), "
                f"max_staleness {args.max_staleness} "
                f"({args.stale_policy}), correction {args.correction}, calc latency lognormal median "
                f"{args.latency_median_s}s sigma {args.latency_sigma} cap {args.latency_max_s}s, held-out "
                f"{args.eval_size} sampled calc episodes per model, overrides {args.override or 'none'}"
                f"{', sync and async run at once' if args.arms_at_once else ''}"
                f"{', each pair (run, with both at once) on CPUs of its own' if args.pin else ''}.")
    (workdir / "summary.json").write_text(json.dumps({"settings": settings, "stats": stats, "pairs": pairs}, indent=2))
    (workdir / "summary.md").write_text(summary_markdown(pairs, stats, settings))
    try:
        plot_pairs(pairs, start, workdir / "pairs.png")
    except ImportError:
        logger.warning("matplotlib is not installed: no pairs.png")
    print(summary_markdown(pairs, stats, settings))
    print(f"workdir={workdir}")
    print(" ".join(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}"
                   for key, value in stats.items() if key != "seeds")
          + f" seeds={','.join(map(str, args.seeds))} steps={args.steps} batch={args.batch} n={args.n} "
          f"max_staleness={args.max_staleness} correction={args.correction}")
    return 0


if __name__ == "__main__":
    relaunch_with_demo_threads()  # torch's threads as the demo has them (the warm-up and evaluations run here)
    sys.exit(main())
