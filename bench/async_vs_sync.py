"""Synchronous vs asynchronous AgentRL training on one workload: ``python -m bench.async_vs_sync``.

Both runs are verl's real ``main_ppo`` on CPU (``cpu_tiny`` preset, the ``agentrl_agent`` loop, ``task_norm_grpo``)
against the same environment stack, with the same model, seed, data, batch and number of steps (so the same
number of trained trajectories):

- ``calc`` with a heavy-tailed environment latency per step (lognormal, capped), and
- the real ``db`` task (DBBench on SQLite).

The synchronous run is ``trainer.v1.trainer_mode=agentrl_sync``; the asynchronous one ``agentrl_async`` with
``agentrl.async.max_staleness=K``. The training time of a run is the sum of verl's per-step wall times
(``timing_s/step``: the step from its start, waiting for the batch included, to the weight update); process
start-up (Ray, workers, model loading) is the same for both and reported apart. The last line printed is
``key=value`` pairs: ``speedup`` = sync training time / async training time (``speedup_after_step1``: the same
without each run's first step, which holds the warm-up), plus each run's rewards and the async run's staleness
and idle fractions.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl_verl.cli import main as agentrl_verl_cli
from agentrl_verl.config import CONFIG_DIR
from agentrl_verl.models.tiny import build_tiny_model
from env_adapters.launcher import EnvStack

logger = logging.getLogger("bench.async_vs_sync")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16, help="training steps of each run")
    parser.add_argument("--batch", type=int, default=4, help="groups (prompts) per step, data.train_batch_size")
    parser.add_argument("--n", type=int, default=4, help="trajectories per group, rollout.n")
    parser.add_argument("--max-staleness", type=int, default=2, help="agentrl.async.max_staleness of the async run")
    parser.add_argument("--stale-policy", default="wait", choices=["wait", "drop", "keep"])
    parser.add_argument("--latency-median-s", type=float, default=0.5, help="median calc step latency")
    parser.add_argument("--latency-sigma", type=float, default=1.2, help="lognormal sigma of the calc step latency")
    parser.add_argument("--latency-max-s", type=float, default=10.0, help="cap of the calc step latency")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None,
                        help="model directory used as is (default: the tiny offline model after a supervised warm-up "
                             "on calc, so that rewards can move and the two runs' reward curves can be compared)")
    parser.add_argument("--out", default=None, help="folder for logs and metrics (default: a temporary one)")
    parser.add_argument("--timeout-s", type=int, default=900, help="limit of each training run")
    return parser.parse_args(argv)


def stack_config(args: argparse.Namespace) -> dict[str, Any]:
    latency = {"dist": "lognormal", "median_s": args.latency_median_s, "sigma": args.latency_sigma,
               "max_s": args.latency_max_s}
    concurrency = (args.max_staleness + 2) * args.batch * args.n  # never the bottleneck of either mode
    return {
        "controller": {"port": 0},
        "workers": [
            {"task": "calc", "name": "calc", "concurrency": concurrency,
             "options": {"size": CALC_SIZE, "seed": args.seed, "step_latency": latency}},
            {"task": "db", "name": "db", "concurrency": concurrency, "options": {"backend": "sqlite"}},
        ],
    }


CALC_SIZE = 256
"""calc indices the runs train on; the warm-up demonstrates and evaluates on the indices after them."""


def cold_started_model(args: argparse.Namespace, workdir: Path) -> Path:
    """The tiny model after the demo's supervised warm-up on calc (its settings from ``demo_run.yaml``).

    An untrained model ends every episode with a malformed first turn: a flat reward, and episodes that never
    reach the multi-turn latency tail. The warm-up runs in-process against the calc task without latency.
    """
    import asyncio
    import dataclasses

    import torch
    from transformers import AutoTokenizer

    from agentrl_verl.cold_start import InProcessEnv, evaluate, generate_demonstrations, supervised_warmup
    from agentrl_verl.demo import load_demo_config

    demo = load_demo_config()
    base = build_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(base)
    options = {"seed": args.seed, "size": CALC_SIZE + demo.eval.warmup_indices + demo.demonstrations}
    held_out = list(range(CALC_SIZE, CALC_SIZE + demo.eval.warmup_indices))
    demos = generate_demonstrations("calc", range(held_out[-1] + 1, options["size"]), options)

    def success(model: torch.nn.Module) -> float:
        env = InProcessEnv("calc", **options)
        result = evaluate(model, tokenizer, env, "calc", held_out, max_turns=demo.eval.max_turns,
                          max_new_tokens=demo.eval.max_new_tokens, max_context=demo.eval.max_context,
                          batch_size=len(held_out))
        return asyncio.run(result).success_rate

    warm = supervised_warmup(base, demos, workdir / "warmup_model", success,
                             dataclasses.replace(demo.warmup, seed=args.seed))
    logger.info("cold start: %d warm-up steps, held-out greedy success %.2f", warm.steps, warm.success)
    return Path(warm.path)


def run_training(mode: str, args: argparse.Namespace, workdir: Path, model: Path, env_url: str) -> dict[str, Any]:
    """One ``main_ppo`` run; returns its per-step metrics and process wall time."""
    metrics_path = workdir / f"{mode}.jsonl"
    ray_dir = Path(tempfile.mkdtemp(prefix="bray_", dir="/tmp"))  # short: Ray's socket paths have a length limit
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={workdir / 'train.parquet'}", f"data.val_files={workdir / 'val.parquet'}",
        f"data.train_batch_size={args.batch}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        f"actor_rollout_ref.rollout.n={args.n}", f"data.seed={args.seed}",
        f"trainer.total_training_steps={args.steps}", "trainer.logger=[console,file]",
        f"trainer.default_local_dir={workdir / 'ckpt'}", f"+ray_kwargs.ray_init._temp_dir={ray_dir}",
        "algorithm.adv_estimator=task_norm_grpo", f"trainer.v1.trainer_mode={mode}",
        # The demo's RL settings for the warmed-up model (temperature 0.8, no penalty; see config/demo/tiny.yaml).
        "actor_rollout_ref.rollout.temperature=0.8", "+agentrl.agent.penalty=0.0",
        f"+agentrl.env.url={env_url}", "+agentrl.agent.max_turns=4", "+agentrl.agent.max_new_tokens=48",
        "+agentrl.agent.max_total_tokens=1024", "data.max_prompt_length=768", "data.max_response_length=256",
    ]
    if mode == "agentrl_async":
        overrides += [f"+agentrl.async.max_staleness={args.max_staleness}",
                      f"+agentrl.async.stale_policy={args.stale_policy}"]
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", CONFIG_DIR, "--config-name", "cpu_tiny",
           *overrides]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "VERL_FILE_LOGGER_PATH": str(metrics_path)}
    start = time.monotonic()
    with open(workdir / f"{mode}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"{mode} run timed out after {args.timeout_s}s; see {workdir / f'{mode}.log'}") from None
        finally:
            subprocess.run(["rm", "-rf", str(ray_dir)], check=False)
    wall = time.monotonic() - start
    if returncode != 0:
        raise RuntimeError(f"{mode} run failed with exit code {returncode}; see {workdir / f'{mode}.log'}")
    steps = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return {"wall_s": wall, "steps": {int(s["step"]): s["data"] for s in steps}}


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    steps = [run["steps"][k] for k in sorted(run["steps"])]
    train_s = sum(float(m["timing_s/step"]) for m in steps)
    return {
        "train_s": train_s,
        "startup_s": run["wall_s"] - train_s,
        "trajectories": sum(float(m.get("agentrl/all/episodes", 0)) for m in steps),
        "reward": [round(float(m.get("agentrl/all/reward", float("nan"))), 3) for m in steps],
        "calc_reward": [round(float(m.get("agentrl/calc/reward", float("nan"))), 3) for m in steps],
        "db_reward": [round(float(m.get("agentrl/db/reward", float("nan"))), 3) for m in steps],
        "step_s": [round(float(m["timing_s/step"]), 2) for m in steps],
        "rollout_idle": [round(float(m[k]), 3) for m in steps if (k := "async/rollout_idle_fraction") in m],
        "trainer_idle": [round(float(m[k]), 3) for m in steps if (k := "async/trainer_idle_fraction") in m],
        "turn_lag_max": [float(m[k]) for m in steps if (k := "async/staleness/turn_lag/max") in m],
        "multi_version": [round(float(m[k]), 3) for m in steps
                          if (k := "async/staleness/multi_version_trajectories") in m],
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    workdir = Path(args.out or tempfile.mkdtemp(prefix="async_vs_sync_"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else cold_started_model(args, workdir)
    with EnvStack(stack_config(args)) as stack:
        rows = (args.steps + args.max_staleness + 2) * args.batch  # the async run admits up to K + 1 batches ahead
        code = agentrl_verl_cli(["make-data", "--controller", stack.url, "--out", str(workdir),
                                 "--train-size", str(rows), "--val-fraction", "0.1", "--seed", str(args.seed)])
        if code != 0:
            raise RuntimeError(f"make-data failed with exit code {code}")
        results = {}
        for mode in ("agentrl_sync", "agentrl_async"):
            logger.info("running %s (%d steps of %d x %d trajectories)", mode, args.steps, args.batch, args.n)
            results[mode] = summarise(run_training(mode, args, workdir, model, stack.url))
            logger.info("%s: %s", mode, json.dumps(results[mode]))
    sync, asynchronous = results["agentrl_sync"], results["agentrl_async"]
    (workdir / "summary.json").write_text(json.dumps(results, indent=2))
    speedup = sync["train_s"] / asynchronous["train_s"]
    # Step 1 holds each run's first generations (model warm-up, prefix caches, env sessions): also compare without.
    steady = sum(sync["step_s"][1:]) / max(sum(asynchronous["step_s"][1:]), 1e-9)
    print(f"workdir={workdir}")
    for mode, result in results.items():
        print(f"{mode}: reward per step {result['reward']} step seconds {result['step_s']}")
    print(
        f"speedup={speedup:.2f} speedup_after_step1={steady:.2f} "
        f"sync_train_s={sync['train_s']:.1f} async_train_s={asynchronous['train_s']:.1f} "
        f"trajectories={int(sync['trajectories'])}/{int(asynchronous['trajectories'])} "
        f"sync_reward_mean={sum(sync['reward']) / len(sync['reward']):.3f} "
        f"async_reward_mean={sum(asynchronous['reward']) / len(asynchronous['reward']):.3f} "
        f"sync_reward_last={sync['reward'][-1]:.3f} async_reward_last={asynchronous['reward'][-1]:.3f} "
        f"max_staleness={args.max_staleness} async_turn_lag_max={max(asynchronous['turn_lag_max'], default=0):.0f} "
        f"async_rollout_idle={sum(asynchronous['rollout_idle']) / max(len(asynchronous['rollout_idle']), 1):.3f} "
        f"async_trainer_idle={sum(asynchronous['trainer_idle']) / max(len(asynchronous['trainer_idle']), 1):.3f} "
        f"steps={args.steps} batch={args.batch} n={args.n} seed={args.seed}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
