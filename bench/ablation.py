"""The AgentRL ablation at small scale: ``python -m bench.ablation``.

The workload is the multi-task demo's (``presets/demo_multitask.yaml``): calc, kg, webshop and alfworld on their easy
settings (``--families`` keeps some of them). One warm-up model (the demo's supervised warm-up on the families'
expert demonstrations, built once and cached under ``$AGENTRL_CACHE_DIR/ablation/``) starts every run. Each run is
verl's real ``main_ppo`` on CPU with the demo's RL preset (``cpu_tiny +demo=tiny`` and the multi-task overrides:
``task_norm_grpo``, the asynchronous trainer, cross-policy sampling), for the same number of steps of the same batch
(so the same number of trained trajectories), in one of these arms (:func:`arms`):

- ``full``: everything on;
- ``fixed_pool``: everything on, the cross-policy pool's second member a fixed other model instead of the stale copy
  (``agentrl.cross_policy.fixed_model_path``; ``--fixed-model``, by default the same warm-up on another data order);
- ``no_task_norm``: ``agentrl.task_adv_norm=off`` (group advantages only);
- ``no_cross_policy``: ``agentrl.cross_policy.enable=false``;
- ``single_<family>``: that family's prompts only, everything on;
- ``sync``: everything on, the synchronous trainer (``agentrl_sync``): paired by seed with ``full``, the speedup of
  the asynchronous pipeline on the real families (``full``'s training time against ``sync``'s) and where each run's
  time goes (verl's per-phase timings, the rollout's and the trainer's idle fractions, each family's episode
  generation and environment time with their 90th percentiles).

After training, each run's final model plays the first ``--eval-size`` held-out indices of every family (never
demonstrated or trained on), sampled at the RL temperature with one sampling seed for every model; the start model
(and with ``fixed_pool`` the fixed model, record ``fixed``) is evaluated once the same way. ``--seeds`` repeats every
arm (the seed sets the data order and which prompts are drawn). ``summary.md`` holds the paper's table (rows arms,
columns families and their mean, each cell held-out success +- its standard error over seeds), what differs between
the families, each arm's training, and cross-policy sampling (the pool's second member, its share of the turns, each
member's log-probs, trajectories with its turns and their success, the updates' clip fraction and KL); with
``summary.json`` and ``ablation.png``. The last line printed is ``key=value`` pairs: each arm's mean success over
families and its standard error over seeds, and with ``full`` and ``sync`` on common seeds the speedup and its
standard error.

Each run lives in ``--out/ARM/seed_S/`` and its ``run.json`` is written after its training and again after its
evaluation, so the same command resumes a bench that was cut off: evaluated runs are kept, trained runs whose model
is still there are only evaluated, the others run again. ``--parallel P`` runs P of them at once, each in its own
process (``--pin``: on its own share of the CPUs); ``--report`` only re-summarises what ``--out`` holds.

Results and how to read them: ``docs/results/ablation.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl_verl.core.cross_policy import CURRENT, FIXED, SHARE_BINS, STALE
from agentrl_verl.harness.threads import relaunch_with_demo_threads
from agentrl_verl.pipeline.evaluation import evaluate_held_out
from agentrl_verl.pipeline.launch import (
    exported_actor,
    read_jsonl,
    rl_command,
    rl_preset_values,
    run_main_ppo,
    write_datasets,
)
from agentrl_verl.pipeline.settings import PipelineConfig, RLSpec, load_pipeline_config
from agentrl_verl.pipeline.stack import Split, sessions, stack_config, task_indices
from agentrl_verl.pipeline.warmup import plan_warmup, warm_up
from agentrl_verl.presets import CONFIG_DIR
from bench.common import mean_and_se, run_processes, saved_record
from env_adapters.launcher import EnvStack

logger = logging.getLogger("bench.ablation")

FAMILIES = ("calc", "kg", "webshop", "alfworld")
"""The multi-task preset's families, the default workload (``--families``). Results made before alfworld could be
carried to the GPU machine (``bench/make_device_wheels.sh``) have the first three."""
HELD_OUT = 100
"""The first indices of each family: evaluated, never demonstrated or trained on (``--eval-size`` plays a prefix)."""
START = "start"
"""The record name of the start model's evaluation (no training)."""
UNTRAINED = (START, FIXED)
"""Records of a model's evaluation without training: the start model's and the fixed pool model's (``fixed``)."""
SYNC = "sync"
"""The arm of the synchronous trainer, paired with ``full`` for the speedup."""
FIXED_WARMUP_SEED = 1
"""``warmup.seed`` of the default fixed pool model: the start model's warm-up on another order of its demonstrations."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of the ablation: the families it trains on and its Hydra overrides of the RL preset."""

    families: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    fixed_model: bool = False
    """The cross-policy pool's second member is the fixed model (``--fixed-model``) instead of the stale copy."""


def arms(families: Sequence[str] = FAMILIES) -> dict[str, Arm]:
    """The arms, by name: ``full``, ``fixed_pool``, ``no_task_norm``, ``no_cross_policy``, ``single_<family>`` for
    each family and ``sync``."""
    every = tuple(families)
    return {"full": Arm(every), "fixed_pool": Arm(every, fixed_model=True),
            "no_task_norm": Arm(every, ("agentrl.task_adv_norm=off",)),
            "no_cross_policy": Arm(every, ("agentrl.cross_policy.enable=false",)),
            **{f"single_{family}": Arm((family,)) for family in families},
            SYNC: Arm(every, ("trainer.v1.trainer_mode=agentrl_sync",))}


def workload(families: Sequence[str] = FAMILIES) -> PipelineConfig:
    """The multi-task demo's settings restricted to ``families``, each with :data:`HELD_OUT` held-out indices."""
    config = load_pipeline_config(Path(CONFIG_DIR) / "demo_multitask.yaml")
    # Concurrency 64: an evaluation plays a family's episodes at most that many at once, within its worker's limit.
    config.tasks = [dataclasses.replace(t, held_out=HELD_OUT, concurrency=64) for t in config.tasks
                    if t.name in families]
    missing = set(families) - {t.name for t in config.tasks}
    if missing:
        raise ValueError(f"demo_multitask.yaml has no task {sorted(missing)}")
    return config


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # START and FIXED are a child's jobs (an untrained model's evaluation), which a bench runs once anyway.
    parser.add_argument("--arms", nargs="+", default=None, choices=[*arms(), *UNTRAINED],
                        help=f"arms to run (default: the paper's ablation, every arm of --families but {SYNC}; "
                             f"--arms full {SYNC}: the asynchronous pipeline's speedup)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES,
                        help="the multi-task preset's families that the runs train on and are evaluated on (default: "
                             "all of them)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run of every arm per seed")
    parser.add_argument("--steps", type=int, default=12, help="training steps of every run")
    parser.add_argument("--batch", type=int, default=None,
                        help="groups (prompts) per step, data.train_batch_size (default: the RL preset's)")
    parser.add_argument("--n", type=int, default=None, help="trajectories per group (default: the RL preset's)")
    parser.add_argument("--eval-size", type=int, default=HELD_OUT,
                        help=f"held-out episodes per family of each model, sampled (at most {HELD_OUT})")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once, each in its own process")
    parser.add_argument("--pin", action="store_true",
                        help="give each of the --parallel runs an equal share of the CPUs this process may use (CPU "
                             "affinity, which its environment stack and Ray workers inherit): no run waits for "
                             "another's cores")
    parser.add_argument("--model", default=None,
                        help="start model used as is (default: the cached warm-up on the families)")
    parser.add_argument("--fixed-model", default=None,
                        help="the fixed_pool arm's pool model, used as is (default: the start model's warm-up with "
                             f"warmup.seed={FIXED_WARMUP_SEED}, cached the same way)")
    parser.add_argument("--base", default=None,
                        help="tiny model the warm-up starts from (default: the one built here, cached)")
    parser.add_argument("--out", default=None, help="folder of the runs and the summary (default: a temporary)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override of every run (repeatable)")
    parser.add_argument("--report", action="store_true", help="run nothing: summarise the runs under --out")
    args = parser.parse_args(argv)
    if not 0 < args.eval_size <= HELD_OUT:
        parser.error(f"--eval-size {args.eval_size}: must be in 1..{HELD_OUT}")
    if args.parallel < 1:
        parser.error(f"--parallel {args.parallel}: must be >= 1")
    if args.report and not args.out:
        parser.error("--report summarises the runs under --out: name it")
    if len(set(args.families)) < len(args.families):
        parser.error(f"--families {' '.join(args.families)}: each family once")
    # In the preset's order, whatever the command's: a run's settings (and so its resumption) do not depend on it.
    args.families = tuple(f for f in FAMILIES if f in args.families)
    if args.arms is None:
        args.arms = [arm for arm in arms(args.families) if arm != SYNC]
    unknown = [arm for arm in args.arms if arm not in (*arms(args.families), *UNTRAINED)]
    if unknown:
        parser.error(f"--arms {' '.join(unknown)}: not an arm of --families {' '.join(args.families)}")
    if args.pin and not hasattr(os, "sched_setaffinity"):
        parser.error("--pin needs CPU affinity (Linux)")
    return args


# ---- the start model ----------------------------------------------------------------------------------


def warmed_up_model(config: PipelineConfig, base: Path | None = None) -> Path:
    """The tiny model after the pipeline's supervised warm-up on ``config``'s tasks (:func:`warm_up`), built once and
    kept under ``$AGENTRL_CACHE_DIR/ablation/``; its ``warmup.json`` holds the warm-up's history. ``base``: the tiny
    model to start from (default: the workload's ``model``; a machine without alfworld builds another tokenizer, so
    there it is carried)."""
    from agentrl_verl.models.cache import default_cache_dir

    base = base or config.model.build()
    plan = plan_warmup(base, config, config.tasks, default_cache_dir() / "ablation")
    if not (plan.path / "config.json").exists():
        logger.info("warm-up on %s", ", ".join(t.name for t in config.tasks))
        with EnvStack(stack_config(config.tasks), startup_timeout=180) as stack:
            warm_up(plan, stack.url, Split.of(asyncio.run(task_indices(stack.url, config.tasks)), config.tasks))
    return plan.path


def fixed_warmup(config: PipelineConfig) -> PipelineConfig:
    """The default fixed pool model's settings: the start model's warm-up with ``warmup.seed``
    :data:`FIXED_WARMUP_SEED` (same base, tokenizer and demonstrations, another order: another model of the same
    kind)."""
    return dataclasses.replace(config, warmup=dataclasses.replace(config.warmup, seed=FIXED_WARMUP_SEED))


def uses_fixed_model(names: Sequence[str]) -> bool:
    """Whether any of the arms ``names`` needs the fixed pool model (``fixed_pool``, or its evaluation)."""
    return any(name == FIXED or (name in arms() and arms()[name].fixed_model) for name in names)


# ---- one run ------------------------------------------------------------------------------------------


def run_settings(args: argparse.Namespace, arm: str, model: Path, fixed: Path | None = None) -> dict[str, Any]:
    """What a run depends on besides its seed; a ``run.json`` made with other settings is not resumed. ``fixed``:
    the fixed pool model, recorded where the arm uses it."""
    spec = arm_spec(arm, args.families)
    settings = {"arm": arm, "families": list(spec.families), "steps": 0 if arm in UNTRAINED else args.steps,
                "batch": args.batch, "n": args.n, "arm_overrides": list(spec.overrides), "overrides": args.override,
                "model": model.name}
    if arm == FIXED or spec.fixed_model:
        settings["fixed_model"] = fixed.name
    return settings


def arm_spec(arm: str, families: Sequence[str]) -> Arm:
    """The arm ``arm`` of a bench on ``families``; an untrained model's evaluation (:data:`UNTRAINED`) plays them
    all."""
    return Arm(tuple(families)) if arm in UNTRAINED else arms(families)[arm]


def run_done(record: dict[str, Any] | None, eval_size: int, families: Sequence[str]) -> bool:
    """Whether a saved run needs nothing more: evaluated on ``eval_size`` episodes of each of ``families``."""
    return record is not None and record.get("eval_size") == eval_size and set(record.get("held_out", {})) == set(
        families)


def write_run(folder: Path, record: dict[str, Any]) -> None:
    """Write ``run.json`` whole or not at all (a run cut off while writing leaves the previous one)."""
    partial = folder / "run.json.tmp"
    partial.write_text(json.dumps(record, indent=2))
    partial.replace(folder / "run.json")


def size_overrides(batch: int | None, n: int | None) -> list[str]:
    """Hydra overrides for ``batch`` groups of ``n`` trajectories (None: the preset's): one mini-batch per step and one
    group per micro-batch, as the demo's preset has them."""
    out = []
    if batch is not None:
        out += [f"data.train_batch_size={batch}", f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}"]
    if n is not None:
        out += [f"actor_rollout_ref.rollout.n={n}", f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={n}"]
    return out


EPISODE_TIME = ("generate_s", "env_latency_s", "turns_p90", "generate_s_p90", "env_latency_s_p90")
"""Per-family series of a run's steps on where an episode's time goes (means over its episodes, and their 90th
percentiles: the tail that a synchronous step waits for)."""
IDLE_FRACTIONS = ("rollout_idle_fraction", "trainer_idle_fraction")
"""The asynchronous trainer's per-step idle fractions of its rollout and of its trainer (``async/...``)."""


STALE_SHARES = ("0", *(f"{low:g}-{high:g}" for low, high in zip((0.0, *SHARE_BINS[:-1]), SHARE_BINS, strict=True)))
"""The bins of a trajectory's share of stale turns in the cross-policy metrics: a share of 0, then up to each of
``SHARE_BINS``."""


def train_summary(history: Sequence[dict[str, Any]], families: Sequence[str]) -> dict[str, Any]:
    """A run's training from verl's per-step metrics (``metrics.jsonl`` rows): training time (the last step's
    checkpoint save left out), the mean per step of each of verl's phase timings and of the asynchronous trainer's
    idle fractions (``timing``: ``gen``, ``update_actor``, ``update_weights``, ``async/wait_for_batch``, ...),
    trajectories, per family its trajectories and per-step reward, success and :data:`EPISODE_TIME`, the mean
    clip fraction and KL of the actor's updates (``off_policy``), and with cross-policy sampling (``cross_policy``,
    else None) the pool's second member (``stale`` or ``fixed``), the mean share of trajectories with its turns, of
    its turns and the stale weights' lag (None for a fixed model), each member's mean behaviour log-prob per
    generated token (``logprob``), and per bin of the second member's share (:data:`STALE_SHARES`) the trajectories
    and their success."""
    steps = [row["data"] for row in sorted(history, key=lambda row: row["step"])]

    def mean(name: str) -> float | None:
        values = [float(m[name]) for m in steps if name in m]
        return round(sum(values) / len(values), 5) if values else None

    shares = {}
    for label in STALE_SHARES:
        counts = [(float(m[f"cross_policy/trajectories/stale_share_{label}"]),
                   float(m[f"cross_policy/success_rate/stale_share_{label}"]))
                  for m in steps if f"cross_policy/trajectories/stale_share_{label}" in m]
        n = sum(c for c, _ in counts)
        shares[label] = {"trajectories": n, "success": round(sum(c * s for c, s in counts) / n, 3) if n else None}
    per_family = {}
    for family in families:
        def series(name: str, family: str = family) -> list[float | None]:
            return [None if f"agentrl/{family}/{name}" not in m else round(float(m[f"agentrl/{family}/{name}"]), 3)
                    for m in steps]

        per_family[family] = {
            "trajectories": sum(float(m.get(f"agentrl/{family}/episodes", 0.0)) for m in steps),
            **{name: series(name) for name in ("reward", "success_rate", "generated_tokens", "env_tokens", "turns",
                                               *EPISODE_TIME)},
        }
    member = FIXED if any(f"cross_policy/turn_share/{FIXED}" in m for m in steps) else STALE
    phases = sorted({key for m in steps for key in m if key.startswith("timing_s/")})
    return {
        "timing": {**{key.removeprefix("timing_s/"): mean(key) for key in phases},
                   **{name: mean(f"async/{name}") for name in IDLE_FRACTIONS}},
        "steps": len(steps),
        "train_s": sum(float(m["timing_s/step"]) - float(m.get("timing_s/save_checkpoint", 0.0)) for m in steps),
        "trajectories": sum(float(m.get("agentrl/all/episodes", 0.0)) for m in steps),
        "families": per_family,
        "off_policy": {"clip_fraction": mean("actor/pg_clipfrac"), "kl": mean("actor/ppo_kl")},
        "cross_policy": None if mean("cross_policy/mixed_trajectory_share") is None else {
            "member": member, "mixed_share": mean("cross_policy/mixed_trajectory_share"),
            "stale_turns": mean(f"cross_policy/turn_share/{member}"),
            "stale_lag": mean("cross_policy/stale_version_lag"),
            "logprob": {name: mean(f"cross_policy/logprob_mean/{name}") for name in (CURRENT, member)},
            "by_stale_share": shares},
    }


def evaluate(model_path: Path, start: Path, url: str, held_out: dict[str, list], config: PipelineConfig,
             eval_size: int) -> dict[str, dict[str, float]]:
    """Sampled held-out play of ``model_path`` on the first ``eval_size`` held-out indices of every family (the
    tokenizer is the start model's, which RL keeps); per family: success, mean reward, share of episodes with a
    partial reward (0 < r < 1), mean turns and episodes."""
    from transformers import AutoTokenizer

    splits = {family: indices[:eval_size] for family, indices in held_out.items()}
    results = evaluate_held_out(url, model_path, AutoTokenizer.from_pretrained(start), splits, config.eval,
                                sessions(config.tasks), seed=config.seed, modes=["sampled"])["sampled"]
    return {family: episode_stats(result.episodes) for family, result in results.items()}


def episode_stats(episodes: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Success rate, mean reward, share of partial rewards (0 < r < 1), mean turns and count of ``episodes``."""
    n = max(len(episodes), 1)
    return {"success": sum(e["success"] for e in episodes) / n, "reward": sum(e["reward"] for e in episodes) / n,
            "partial": sum(0.0 < e["reward"] < 1.0 for e in episodes) / n,
            "turns": sum(e["turns"] for e in episodes) / n, "episodes": len(episodes)}


def run_one(args: argparse.Namespace, arm: str, seed: int, folder: Path, model: Path, config: PipelineConfig,
            fixed: Path | None = None) -> dict[str, Any]:
    """One run, resumed from ``folder``: trained (unless one of :data:`UNTRAINED`, or trained before and its model is
    still there), then evaluated; ``run.json`` is written after each. ``fixed``: the fixed pool model (of the arms
    that use it). Returns its record."""
    settings = run_settings(args, arm, model, fixed)
    saved = saved_record(folder / "run.json", settings)
    if run_done(saved, args.eval_size, args.families):
        logger.info("%s seed %d: done before, kept", arm, seed)
        return saved
    spec = arm_spec(arm, args.families)
    spec = dataclasses.replace(spec, overrides=arm_overrides(spec, fixed))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "env_logs").mkdir(exist_ok=True)
    with EnvStack(stack_config(config.tasks), log_dir=folder / "env_logs", startup_timeout=180) as stack:
        split = Split.of(asyncio.run(task_indices(stack.url, config.tasks)), config.tasks)
        held_out, train = split.held_out, split.train
        if arm in UNTRAINED:
            final, record = model if arm == START else fixed, {"arm": arm, "seed": seed, "settings": settings}
        elif saved is not None and Path(saved["model"], "config.json").exists():
            logger.info("%s seed %d: trained before, evaluating its model", arm, seed)
            final, record = Path(saved["model"]), saved
        else:
            final = train_run(args, arm, spec, seed, folder, model, config, stack.url, train, held_out)
            record = {"arm": arm, "seed": seed, "settings": settings, "model": str(final),
                      "train": train_summary(_read_metrics(folder), spec.families)}
            write_run(folder, record)
        record = {**record, "held_out": evaluate(final, model, stack.url, held_out, config, args.eval_size),
                  "eval_size": args.eval_size}
    write_run(folder, record)
    logger.info("%s seed %d: held-out success %s", arm, seed,
                ", ".join(f"{f} {v['success']:.3f}" for f, v in record["held_out"].items()))
    return record


def arm_overrides(spec: Arm, fixed: Path | None) -> tuple[str, ...]:
    """The arm's Hydra overrides of the RL preset, with the fixed pool model where the arm uses it (the model's path is
    the bench's, not the arm's: :func:`run_settings` records its name)."""
    if not spec.fixed_model:
        return spec.overrides
    # ++: the demo preset's agentrl.cross_policy has no such key, and Hydra refuses a plain override of a missing one.
    return (*spec.overrides, f"++agentrl.cross_policy.fixed_model_path={fixed}")


def train_run(args: argparse.Namespace, arm: str, spec: Arm, seed: int, folder: Path, model: Path,
              config: PipelineConfig, url: str, train: dict[str, list], held_out: dict[str, list]) -> Path:
    """The verl run of one arm and seed, as the demo's RL phase runs it; returns its final model (HF export)."""
    rl = RLSpec(steps=args.steps, stall_s=config.rl.stall_s,
                overrides=[*config.rl.overrides, *size_overrides(args.batch, args.n), *spec.overrides, *args.override])
    preset = rl_preset_values(rl)
    batch, staleness = int(preset.data.train_batch_size), int(preset.agentrl["async"].max_staleness)
    weights = {t.name: t.weight for t in config.tasks if t.name in spec.families}
    # The asynchronous trainer admits up to max_staleness + 1 batches ahead of the one it trains.
    rows = (args.steps + staleness + 1) * batch
    train_file, val_file = write_datasets(folder / "data", {f: train[f] for f in spec.families},
                                          {f: held_out[f] for f in spec.families}, weights, rows, seed)
    ray_dir = Path(tempfile.mkdtemp(prefix="abl-ray-", dir="/tmp"))  # short: Ray's socket path limit
    try:
        cmd = rl_command(str(model), train_file, val_file, url, folder, ray_dir, rl, seed)
        logger.info("%s seed %d: %d steps of %d groups (%s)", arm, seed, args.steps, batch, ", ".join(spec.families))
        run_main_ppo(cmd, folder, list(spec.families), args.steps, rl.stall_s, env=rl.platform_env())
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    return exported_actor(folder / "checkpoints", args.steps)


def _read_metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    return read_jsonl(path) if path.exists() else []


# ---- many runs ----------------------------------------------------------------------------------------


def jobs(args: argparse.Namespace) -> list[tuple[str, int]]:
    """``(arm, seed)`` of every run, the untrained models' evaluations first (the start model's, and the fixed pool
    model's where an arm uses it; seed 0: they do not train)."""
    untrained = [START, *([FIXED] if uses_fixed_model(args.arms) else [])]
    return [(arm, 0) for arm in untrained] + [(arm, seed) for seed in args.seeds for arm in args.arms
                                              if arm not in UNTRAINED]


def run_folder(workdir: Path, arm: str, seed: int) -> Path:
    return workdir / arm if arm in UNTRAINED else workdir / arm / f"seed_{seed}"


def run_children(args: argparse.Namespace, argv: Sequence[str], workdir: Path, model: Path,
                 fixed: Path | None = None) -> None:
    """Run every job not done yet under ``workdir`` in its own process, ``--parallel`` at once. A child gets this
    command line with its own ``--arms``, ``--seeds``, ``--out``, ``--model`` and ``--fixed-model`` (the last
    occurrence of an option wins) and ``--parallel 1``; with ``--pin``, a share of the CPUs
    (:func:`bench.common.cpu_shares`), handed to the next run when it ends.

    Raises:
        RuntimeError: a child failed (the others ran to their end; see its ``bench.log``).
    """
    commands = {}
    for arm, seed in jobs(args):
        folder = run_folder(workdir, arm, seed)
        if run_done(saved_record(folder / "run.json", run_settings(args, arm, model, fixed)), args.eval_size,
                    args.families):
            continue
        folder.mkdir(parents=True, exist_ok=True)
        commands[f"{arm} seed {seed}"] = ([sys.executable, "-m", "bench.ablation", *argv, "--arms", arm, "--seeds",
                                           str(seed), "--out", str(workdir), "--model", str(model),
                                           *(["--fixed-model", str(fixed)] if fixed else []), "--parallel", "1",
                                           "--child"], folder / "bench.log")
    failed = run_processes(commands, args.parallel, args.pin, stop_s=40)
    if failed:
        raise RuntimeError(f"runs {failed} failed; see their bench.log under {workdir}")


def load_runs(workdir: Path) -> list[dict[str, Any]]:
    """Every ``run.json`` under ``workdir`` (``--report``), evaluated or not."""
    return [json.loads(path.read_text()) for path in sorted(workdir.glob("**/run.json"))]


def bench_families(records: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The families of a bench's runs (``--families``), in :data:`FAMILIES`' order: every evaluation plays them all,
    and the multi-task arms' settings and training name them."""
    named = {f for r in records for f in (*r.get("held_out", {}), *r.get("settings", {}).get("families", ()),
                                          *r.get("train", {}).get("families", {}))}
    return tuple(f for f in FAMILIES if f in named)


# ---- the report ---------------------------------------------------------------------------------------


def arm_statistics(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm (in the order of :func:`arms`, the start model first): per family and for the mean over families, the
    mean held-out success over seeds and its standard error, and the seeds; plus ``specialists`` (each
    ``single_<family>`` arm on its own family) when every single-task arm was evaluated. Records without an evaluation
    are left out."""
    families = bench_families(records)
    order = [*UNTRAINED, *arms(families)]
    evaluated = [r for r in records if set(r.get("held_out", {})) == set(families)]
    stats: dict[str, dict[str, Any]] = {}
    for arm in sorted({r["arm"] for r in evaluated}, key=order.index):
        runs = sorted((r for r in evaluated if r["arm"] == arm), key=lambda r: r["seed"])
        row: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
        for family in families:
            row[family] = mean_and_se([r["held_out"][family]["success"] for r in runs])
        row["mean"] = mean_and_se([sum(r["held_out"][f]["success"] for f in families) / len(families) for r in runs])
        stats[arm] = row
    singles = [f"single_{family}" for family in families]
    if all(arm in stats for arm in singles):
        # Seeds pair the specialists: seed s's mean is over the single-task runs of seed s.
        seeds = sorted(set.intersection(*(set(stats[arm]["seeds"]) for arm in singles)))
        by_seed = {(r["arm"], r["seed"]): r for r in evaluated}
        row = {"seeds": seeds}
        for family in families:
            row[family] = stats[f"single_{family}"][family]
        row["mean"] = mean_and_se([sum(by_seed[f"single_{f}", s]["held_out"][f]["success"] for f in families)
                                   / len(families) for s in seeds]) if seeds else (math.nan, math.nan)
        stats["specialists"] = row
    return stats


def paired_differences(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per pair of multi-task arms (``A - B``, in the order of :func:`arms`) evaluated on two seeds or more in common:
    per family and for the mean over families, the mean over those seeds of A's held-out success minus B's and its
    standard error, and the seeds. A seed sets the same prompts and data order in every arm, so pairing by seed takes
    that share of the spread out."""
    families = bench_families(records)
    success = {(r["arm"], r["seed"]): r["held_out"] for r in records
               if r["arm"] in arms(families) and set(r.get("held_out", {})) == set(families)}
    multi = [arm for arm, spec in arms(families).items()
             if spec.families == families and any(a == arm for a, _ in success)]

    def value(arm: str, seed: int, key: str) -> float:
        held = success[arm, seed]
        return sum(held[f]["success"] for f in families) / len(families) if key == "mean" else held[key]["success"]

    out = {}
    for i, first in enumerate(multi):
        for second in multi[i + 1:]:
            seeds = sorted({s for a, s in success if a == first} & {s for a, s in success if a == second})
            if len(seeds) >= 2:
                out[f"{first} - {second}"] = {"seeds": seeds, **{key: mean_and_se(
                    [value(first, s, key) - value(second, s, key) for s in seeds]) for key in (*families, "mean")}}
    return out


def speedups(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The asynchronous pipeline's speedup, paired by seed: per seed trained in both ``full`` and :data:`SYNC`,
    ``sync``'s training time over ``full``'s (the same steps of the same batch: the same trajectories); their mean
    and standard error over seeds. None without such a seed."""
    train_s = {(r["arm"], r["seed"]): r["train"]["train_s"] for r in records if "train" in r}
    seeds = sorted(s for a, s in train_s if a == SYNC and ("full", s) in train_s)
    if not seeds:
        return None
    ratios = [train_s[SYNC, s] / train_s["full", s] for s in seeds]
    return {"seeds": seeds, "speedup": mean_and_se(ratios), "per_seed": dict(zip(seeds, ratios, strict=True)),
            "train_s": {arm: mean_and_se([train_s[arm, s] for s in seeds]) for arm in ("full", SYNC)}}


def speed_table(records: Sequence[dict[str, Any]]) -> list[str]:
    """The asynchronous pipeline against the synchronous trainer (Markdown): the speedup per seed and its mean, then
    per arm where a step's time goes (verl's phase timings and the idle fractions, means over steps and seeds) and
    per family where an episode's time goes (:data:`EPISODE_TIME`, means over steps and seeds). Empty without a seed
    of both arms."""
    speed = speedups(records)
    if speed is None:
        return []
    families = bench_families(records)
    lines = ["## Asynchronous vs synchronous", "",
             f"Speedup (`{SYNC}` training time / `full` training time, the same trajectories): "
             f"**{speed['speedup'][0]:.2f} +- {speed['speedup'][1]:.2f}** over {len(speed['seeds'])} seeds "
             f"({', '.join(f'seed {s}: {v:.2f}' for s, v in speed['per_seed'].items())}); training time "
             f"{speed['train_s']['full'][0]:.0f} s (`full`) and {speed['train_s'][SYNC][0]:.0f} s (`{SYNC}`) a run.",
             ""]
    runs = {arm: [r["train"] for r in records if r["arm"] == arm and r["seed"] in speed["seeds"] and "train" in r]
            for arm in ("full", SYNC)}

    def average(values: Sequence[float | None]) -> str:
        present = [v for v in values if v is not None]
        return f"{sum(present) / len(present):.2f}" if present else "-"

    timed = {key for trains in runs.values() for t in trains for key in t.get("timing", {})}
    phases = [*sorted(timed - set(IDLE_FRACTIONS)), *(name for name in IDLE_FRACTIONS if name in timed)]
    lines += ["Where a step's time goes (s per step, fractions of the step; means over steps and seeds):", "",
              f"| arm | {' | '.join(phases)} |", "| --- |" + " --- |" * len(phases)]
    for arm, trains in runs.items():
        lines.append(f"| {arm} | " + " | ".join(average([t.get('timing', {}).get(p) for t in trains])
                                              for p in phases) + " |")
    lines += ["", "Where an episode's time goes, per family (s, turns; means over steps and seeds):", "",
              f"| family | arm | {' | '.join(EPISODE_TIME)} |", "| --- | --- |" + " --- |" * len(EPISODE_TIME)]
    for family in families:
        for arm, trains in runs.items():
            cells = [average([v for t in trains for v in t["families"].get(family, {}).get(name, [])])
                     for name in EPISODE_TIME]
            lines.append(f"| {family} | {arm} | {' | '.join(cells)} |")
    return [*lines, ""]


def binomial_se(p: float, n: int) -> float:
    """Standard error of a success rate ``p`` measured on ``n`` episodes."""
    return math.sqrt(p * (1 - p) / n) if n else math.nan


def family_table(records: Sequence[dict[str, Any]]) -> list[str]:
    """What differs between the families (Markdown rows): the start model's held-out play (success, mean reward,
    share of partial rewards, turns) and the ``full`` arm's first RL step with episodes of the family (tokens generated
    and from the environment per episode, training success with any positive reward counted)."""
    families = bench_families(records)
    start = next((r for r in records if r["arm"] == START and "held_out" in r), None)
    full = [r for r in records if r["arm"] == "full" and "train" in r]
    lines = ["| family | start success | start mean reward | partial rewards | turns | generated tokens "
             "| env tokens | first RL step's success (reward > 0) |", "|" + " --- |" * 8]

    def first(family: str, name: str) -> str:
        # A step's random batch may hold no group of a family: its first step that does.
        values = [next(v for v in r["train"]["families"][family][name] if v is not None) for r in full
                  if any(v is not None for v in r["train"]["families"][family][name])]
        return f"{sum(values) / len(values):.2f}" if values else "-"

    for family in families:
        s = start["held_out"][family] if start else None
        cells = ["-"] * 4 if s is None else [f"{s['success']:.2f}", f"{s['reward']:.2f}", f"{s['partial']:.2f}",
                                             f"{s['turns']:.1f}"]
        lines.append(f"| {family} | {' | '.join(cells)} | {first(family, 'generated_tokens')} "
                     f"| {first(family, 'env_tokens')} | {first(family, 'success_rate')} |")
    return lines


def describe(records: Sequence[dict[str, Any]]) -> str:
    """The runs' settings in a sentence (from their records, so that ``--report`` states what ran)."""
    trained = [r["settings"] for r in records if r["arm"] not in UNTRAINED]
    if not trained:
        return "No training run yet."
    s, families = trained[0], bench_families(records)
    sizes = sorted({str(r["eval_size"]) for r in records if "eval_size" in r})
    fixed = sorted({r["settings"]["fixed_model"] for r in records if "fixed_model" in r["settings"]})
    return (f"Families {', '.join(families)} (demo_multitask.yaml's easy settings), start model {s['model']}"
            f"{''.join(f', fixed pool model {name}' for name in fixed)}; "
            f"{s['steps']} steps of {s['batch'] or 'the preset'} groups x {s['n'] or 'the preset'} trajectories per "
            f"run; held-out {' / '.join(sizes) or '-'} sampled episodes per family per model; extra overrides "
            f"{s['overrides'] or 'none'}.")


def summary_markdown(records: Sequence[dict[str, Any]], stats: dict[str, dict[str, Any]], settings: str) -> str:
    """The report: the paper's table (rows arms; columns families and their mean; success +- s.e. over seeds), the
    families' differences, and each arm's training (trajectories per family, time)."""
    families = bench_families(records)
    lines = ["# bench.ablation", "", settings, "",
             "Held-out success (sampled), mean +- standard error over seeds:", "",
             f"| arm | seeds | {' | '.join(families)} | mean |", "| --- | --- |" + " --- |" * (len(families) + 1)]
    for arm, row in stats.items():
        cells = " | ".join(f"{row[key][0]:.3f} +- {row[key][1]:.3f}" for key in (*families, "mean"))
        lines.append(f"| {arm} | {len(row['seeds'])} | {cells} |")
    episodes = sorted({v["episodes"] for r in records for v in r.get("held_out", {}).values()})
    if episodes:
        worst = max(binomial_se(r["held_out"][f]["success"], r["held_out"][f]["episodes"])
                    for r in records if "held_out" in r for f in families)
        lines += ["", f"Each run's rate of a family is over {', '.join(map(str, episodes))} held-out episodes "
                      f"(binomial standard error at most {worst:.3f} in any run). `specialists`: each single-task "
                      "arm on its own family (the paper's single-task comparison); a single-task arm's other "
                      "families show what training on one family does to the others."]
    pairs = paired_differences(records)
    if pairs:
        lines += ["", "Paired by seed: the difference of two arms' held-out success on each seed they share, mean +- "
                      "standard error over those seeds:", "",
                  f"| arms | seeds | {' | '.join(families)} | mean |", "| --- | --- |" + " --- |" * (len(families) + 1)]
        for name, row in pairs.items():
            cells = " | ".join(f"{row[key][0]:+.3f} +- {row[key][1]:.3f}" for key in (*families, "mean"))
            lines.append(f"| {name} | {len(row['seeds'])} | {cells} |")
    lines += ["", "## The families", "", *family_table(records), "",
              "## Training", "", f"| arm | seed | steps | trajectories | {' | '.join(families)} (trajectories) "
              "| training s |", "| --- | --- | --- | --- |" + " --- |" * (len(families) + 1)]
    trained = sorted((r for r in records if "train" in r), key=lambda r: ([*arms(families)].index(r["arm"]), r["seed"]))
    for r in trained:
        t = r["train"]
        per = " | ".join(f"{t['families'][f]['trajectories']:.0f}" if f in t["families"] else "0" for f in families)
        lines.append(f"| {r['arm']} | {r['seed']} | {t['steps']} | {t['trajectories']:.0f} | {per} "
                     f"| {t['train_s']:.0f} |")
    return "\n".join([*lines, "", *speed_table(records), *cross_policy_table(trained)]) + "\n"


def cross_policy_table(trained: Sequence[dict[str, Any]]) -> list[str]:
    """Cross-policy sampling and the updates' off-policyness (Markdown): per trained run, the mean clip fraction and
    KL of its updates and, with cross-policy sampling, the pool's second member (``stale`` copy or ``fixed`` model),
    the share of trajectories with its turns, of its turns, the stale weights' lag (steps), each member's mean
    behaviour log-prob per generated token, and training success (trajectories) per bin of a trajectory's share of
    the second member's turns."""
    lines = ["## Cross-policy sampling", "",
             "Per training step, means over the run; the pool's second member (`stale`: the actor's weights of a few "
             "steps before; `fixed`: the fixed model), its share of the turns, the mean log-prob of the tokens each "
             "member generated (behaviour log-probs), and training success (trajectories) by the share of a "
             "trajectory's turns that the second member generated (`stale share`).", "",
             "| arm | seed | clip fraction | KL | member | with its turns | its turns | stale lag | logprob current "
             "| logprob member | " + " | ".join(f"stale share {label}" for label in STALE_SHARES) + " |",
             "| --- | --- |" + " --- |" * (8 + len(STALE_SHARES))]

    def number(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for r in trained:
        off, cross = r["train"].get("off_policy", {}), r["train"].get("cross_policy")
        cells = [number(off.get("clip_fraction"), 4), number(off.get("kl"), 4)]
        if cross is None:
            cells += ["-"] * (6 + len(STALE_SHARES))
        else:
            # Records of an earlier bench have no member or log-probs: their member is the stale copy.
            member, logprob = cross.get("member", STALE), cross.get("logprob", {})
            cells += [member, number(cross["mixed_share"], 2), number(cross["stale_turns"], 2),
                      number(cross["stale_lag"], 1), number(logprob.get(CURRENT), 3), number(logprob.get(member), 3)]
            cells += ["-" if not b["trajectories"] else f"{b['success']:.2f} ({b['trajectories']:.0f})"
                      for b in (cross["by_stale_share"][label] for label in STALE_SHARES)]
        lines.append(f"| {r['arm']} | {r['seed']} | {' | '.join(cells)} |")
    return lines


def plot(stats: dict[str, dict[str, Any]], families: Sequence[str], path: Path) -> None:
    """Grouped bars: each arm's held-out success per family of ``families`` and their mean, with standard-error
    bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [*families, "mean"]
    width = 0.8 / max(len(stats), 1)
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, (arm, row) in enumerate(stats.items()):
        xs = [k + (i - (len(stats) - 1) / 2) * width for k in range(len(keys))]
        ax.bar(xs, [row[k][0] for k in keys], width, yerr=[row[k][1] for k in keys], capsize=2, label=arm)
    ax.set_xticks(range(len(keys)), keys)
    ax.set(title="held-out success (sampled), mean +- s.e. over seeds", ylabel="success rate", ylim=(0, 1))
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def headline(stats: dict[str, dict[str, Any]], speed: dict[str, Any] | None = None) -> str:
    """The last line: each arm's mean success over families and its standard error over seeds, and the
    asynchronous pipeline's speedup (:func:`speedups`) where ``speed`` has it."""
    line = " ".join(f"{arm}={row['mean'][0]:.3f} {arm}_se={row['mean'][1]:.3f}" for arm, row in stats.items())
    if speed is not None:
        line += f" speedup={speed['speedup'][0]:.3f} speedup_se={speed['speedup'][1]:.3f}"
    return line


# ---- the command --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    # force: importing verl already gave the root logger a WARNING-level handler.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    child = "--child" in argv  # one run of a parent's, which reports
    args = parse_args([a for a in argv if a != "--child"])
    # A timeout's SIGTERM unwinds like Ctrl-C: verl runs, children and environment stacks are stopped on the way.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = Path(args.out or tempfile.mkdtemp(prefix="ablation_")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if not args.report:
        config = workload(args.families)
        # Resolved: each verl run works in its own folder.
        base = args.base and Path(args.base)
        model = Path(args.model).resolve() if args.model else warmed_up_model(config, base)
        fixed = None
        if uses_fixed_model(args.arms):
            fixed = (Path(args.fixed_model).resolve() if args.fixed_model
                     else warmed_up_model(fixed_warmup(config), base))
        if child:
            (arm, seed), = [(a, s) for a in args.arms for s in args.seeds]
            run_one(args, arm, seed, run_folder(workdir, arm, seed), model, config, fixed)
            return 0
        if args.parallel > 1:
            run_children(args, [a for a in argv if a != "--child"], workdir, model, fixed)
        else:
            for arm, seed in jobs(args):
                run_one(args, arm, seed, run_folder(workdir, arm, seed), model, config, fixed)
    records = load_runs(workdir)
    stats = arm_statistics(records)
    settings = describe(records)
    speed = speedups(records)
    (workdir / "summary.json").write_text(json.dumps({"settings": settings, "stats": stats,
                                                      "paired": paired_differences(records), "speed": speed,
                                                      "runs": records}, indent=2))
    (workdir / "summary.md").write_text(summary_markdown(records, stats, settings))
    try:
        plot(stats, bench_families(records), workdir / "ablation.png")
    except ImportError:
        logger.warning("matplotlib is not installed: no ablation.png")
    print(summary_markdown(records, stats, settings))
    print(f"workdir={workdir}")
    print(headline(stats, speed))
    return 0


if __name__ == "__main__":
    relaunch_with_demo_threads()  # torch's threads as the demo has them (the warm-up and evaluations run here)
    sys.exit(main())
