"""``agentrl-verl demo``: the first thing to run - agentic RL of a tiny model on CPU, end to end, no downloads.

What it does, in order (settings: ``presets/demo_run.yaml``, RL preset ``presets/demo/tiny.yaml``):

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
   too (``rl.start_with_warmup``), its trainer waiting (``agentrl.start_model_wait_s``) for its start model, which
   appears once step 4 is done: the evaluation and RL never hold the GPU at once.
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
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agentrl_verl.harness.threads import relaunch_with_demo_threads
from agentrl_verl.models.cache import default_cache_dir
from agentrl_verl.pipeline.cold_start import WarmupResult, device_setting
from agentrl_verl.pipeline.evaluation import evaluate_held_out, held_out_changes
from agentrl_verl.pipeline.launch import (
    RLRun,
    RLStopped,
    check_rl_settings,
    exported_actor,
    read_jsonl,
    rl_command,
    rl_preset_values,
    write_datasets,
)
from agentrl_verl.pipeline.settings import ENGINES, PipelineConfig, load_pipeline_config
from agentrl_verl.pipeline.stack import Split, resolve_backends, sessions, stack_config, task_indices
from agentrl_verl.pipeline.warmup import plan_warmup, warm_up
from agentrl_verl.presets import CONFIG_DIR
from agentrl_verl.tools.evaluate import EvalResult
from env_adapters.sandbox.containers import docker_available

logger = logging.getLogger(__name__)

START_MODEL_WAIT_S = 6 * 3600.0
"""How long verl's early-started trainer waits for its start model: the warm-up (up to ``warmup.max_steps``, with its
checks) and the evaluation before RL, however long they take on the model at hand. The demo stops the run itself
when a phase fails, and the run gets SIGTERM when the demo dies; this bound only keeps the wait finite."""

# ---- the report ---------------------------------------------------------------------------------------


def summary_table(tasks: dict[str, Any], tiny: bool = True) -> str:
    """A Markdown table of :func:`~agentrl_verl.pipeline.evaluation.held_out_changes`' result (success +- its standard
    error), with the zero-shot column where the base model was evaluated, and, for the ``tiny`` model, a note on the
    tasks it is not expected to learn."""
    base = any("success_base" in row[mode] for row in tasks.values() for mode in ("greedy", "sampled") if mode in row)
    head = "| task | eval | held-out |" + (" zero-shot |" if base else "")
    lines = [head + " success before RL | success after RL | change |",
             "| --- " * (6 + base) + "|"]
    for task, row in tasks.items():
        for mode in ("greedy", "sampled"):
            if mode in row:
                r = row[mode]
                after = (f"{r['success_after']:.3f} ± {r['se_after']:.3f} | {r['success_change']:+.3f}"
                         if "success_after" in r else "- | -")
                zero = f" {r['success_base']:.3f} ± {r['se_base']:.3f} |" if "success_base" in r else \
                    (" - |" if base else "")
                lines.append(f"| {task} | {mode} | {row['held_out']} |{zero} {r['success_before']:.3f} ± "
                             f"{r['se_before']:.3f} | {after} |")
    hard = [t for t, row in tasks.items() if not row["learnable"]]
    if hard and tiny:
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
    config: PipelineConfig
    started: float = field(default_factory=time.monotonic)
    timings: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    """How a task was set up where its settings left a choice (db's ``backend: auto``), by task name."""
    tasks: list[str] = field(default_factory=list)
    learnable: list[str] = field(default_factory=list)
    demonstrations: int = 0
    warm: WarmupResult | None = None
    warmup_cache: dict[str, Any] | None = None
    """With ``warmup.reuse``: the cached model's ``dir`` and whether it was ``reused`` (else built by this run)."""
    base: dict[str, dict[str, EvalResult]] | None = None
    """With ``eval.base``: the model the run starts from, zero-shot (before its warm-up)."""
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
    rl_history = read_jsonl(metrics_file) if metrics_file.exists() else []
    progress.timings["total_s"] = round(time.monotonic() - progress.started, 1)
    with open(out / "trajectories.jsonl", "w") as f:
        for phase, results in (("base", progress.base), ("before_rl", progress.before), ("after_rl", progress.after)):
            for mode, per_task in (results or {}).items():
                for result in per_task.values():
                    for episode in result.episodes:
                        f.write(json.dumps({"phase": phase, "eval": mode, **episode}) + "\n")
    per_task = (held_out_changes(progress.before, progress.after, progress.learnable, progress.base)
                if progress.before else {})
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
        "task_notes": progress.notes,
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
    table = summary_table(per_task, tiny=config.model.name == "tiny") if per_task else "(no held-out evaluation yet)"
    tasks_line = "".join(f"{name}: {why}.\n" for name, why in {**progress.notes, **{
        name: f"left out ({why})" for name, why in progress.skipped.items()}}.items())
    (out / "summary.md").write_text(f"{head}Model: `{config.model.name}`.\n\n{table}\n\n"
                                    f"{tasks_line + chr(10) if tasks_line else ''}{warmup_line(progress)}Timings (s): "
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


def run_demo(output_dir: str | os.PathLike, config: PipelineConfig) -> dict[str, Any]:
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
    from transformers import AutoTokenizer

    from env_adapters.launcher import EnvStack

    out, config = progress.out, progress.config
    tasks, progress.notes = resolve_backends(config.tasks)
    if any(t.needs_docker for t in tasks) and not docker_available():
        progress.skipped = {t.name: "no Docker daemon answers" for t in tasks if t.needs_docker}
        tasks = [t for t in tasks if not t.needs_docker]
        logger.warning("Docker is not available: leaving out %s", sorted(progress.skipped))
    progress.tasks, progress.learnable = [t.name for t in tasks], [t.name for t in tasks if t.learnable]

    eval_device = device_setting(config.warmup.device, "warmup.device")
    t = time.monotonic()
    model_dir = config.model.path()  # built after verl's launch, which does not read it

    env_logs = out / "env_logs"
    env_logs.mkdir(exist_ok=True)
    with EnvStack(stack_config(tasks), log_dir=env_logs, startup_timeout=180) as stack:
        logger.info("environment stack at %s: %s (logs in %s)", stack.url, ", ".join(progress.tasks), env_logs)
        split = Split.of(asyncio.run(task_indices(stack.url, tasks)), tasks)
        t = progress.lap("env_start_s", t)

        def evaluate(path: str | Path) -> dict[str, dict[str, EvalResult]]:
            # Where the warm-up trains (on a GPU, the CPU's cores stay with verl's processes beside it).
            return evaluate_held_out(stack.url, path, tokenizer, split.held_out, config.eval, sessions(tasks),
                                     device=eval_device, seed=config.seed,
                                     repeats={t.name: t.eval_repeats for t in tasks})

        # The warm-up model's directory is known before it exists, and appears whole: where the warm-up trains on a
        # GPU, verl's run starts first (rl.start_with_warmup) and its start-up - processes importing verl one after
        # another - overlaps the warm-up and the evaluation before RL, its trainer waiting for its start model
        # (agentrl.start_model_wait_s), a link to the warm-up's that appears once that evaluation is done: the two
        # never hold the card at once (with SmolLM2 the evaluation's 26 GiB beside RL's ran an H100 out of memory).
        plan = plan_warmup(model_dir, config, tasks, default_cache_dir() / "demo", output_dir=out)
        early = config.rl.starts_with_warmup(config.warmup.device)
        start_model = out / "rl_start_model" if early else Path(plan.path)
        batch = int(OmegaConf.select(rl_preset_values(config.rl), "data.train_batch_size"))
        train_file, val_file = write_datasets(out / "data", split.train, split.held_out,
                                              {t.name: t.weight for t in tasks}, config.rl.steps * batch, config.seed)
        ray_dir = Path(tempfile.mkdtemp(prefix="agentrl-demo-ray-", dir="/tmp"))  # short: Ray's socket path limit
        progress.command = rl_command(str(start_model), train_file, val_file, stack.url, out, ray_dir, config.rl,
                                      config.seed, start_model_wait_s=START_MODEL_WAIT_S if early else 0.0)
        rl = RLRun(progress.command, out, progress.tasks, config.rl)
        try:
            if early:
                rl.start()
            config.model.build()
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            t = progress.lap("build_model_s", t)
            if config.eval.base:
                progress.base = evaluate(model_dir)
                t = progress.lap("eval_base_s", t)
            warm = warm_up(plan, stack.url, split)
            if plan.cache is not None:
                progress.warmup_cache = {"dir": str(plan.path), "reused": warm.reused}
            progress.warm, progress.demonstrations = warm.result, warm.demonstrations
            t = progress.lap("warmup_s", t)
            if not early:
                rl.start()
            progress.before = evaluate(warm.result.path)
            progress.lap("eval_before_s", t)
            if early:
                start_model.symlink_to(Path(warm.result.path).resolve(), target_is_directory=True)
            rl.wait()
        except BaseException:
            rl.stop()
            raise
        finally:
            shutil.rmtree(ray_dir, ignore_errors=True)
        t = progress.lap("rl_s", rl.started)

        progress.after = evaluate(exported_actor(out / "checkpoints", config.rl.steps))
        progress.lap("eval_after_s", t)


SETTINGS = {"tiny": "demo_run.yaml", "smollm2": "demo_smollm2.yaml"}
"""``--model`` -> its embedded settings (``agentrl_verl/presets/``)."""


def cpu_smoke(config: PipelineConfig) -> list[str]:
    """Overrides that shrink a real model's run to a smoke that a CPU finishes in minutes: two held-out indices and a
    few demonstrations per task, two warm-up steps, greedy evaluation only (not the base model's), three turns of 48
    tokens at most, two RL steps of two groups of two."""
    per_task = [f"tasks.{i}.{key}" for i in range(len(config.tasks)) for key in ("held_out=2", "eval_repeats=1",
                                                                                 "demonstrations=4")]
    return [*per_task, "demonstrations=4", "warmup.max_steps=2", "warmup.batch_size=4", "warmup.eval_every=2",
            "eval.warmup_indices=2", "eval.sampled=false", "eval.base=false", "eval.max_turns=3",
            "eval.max_new_tokens=48", "rl.steps=2",
            f"rl.overrides=[{','.join([*config.rl.overrides, *CPU_SMOKE_RL])}]"]


CPU_SMOKE_RL = ("data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2048",
                "agentrl.agent.max_turns=3", "agentrl.agent.max_new_tokens=48")
"""The verl run's size in :func:`cpu_smoke`. Micro-batches of at most 2,048 tokens (the longest episode the layer
allows): in fp32 an update of SmolLM2 over 4,096 tokens took 11.7 GB of host memory, and Ray's memory monitor killed
it on a 24 GiB machine beside the replicas and the environment."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default="outputs/demo", help="where results go (default outputs/demo)")
    parser.add_argument("--model", choices=sorted(SETTINGS), default="tiny",
                        help="tiny: the 1.6M-parameter offline model on the CPU (default); smollm2: "
                             "SmolLM2-135M-Instruct on all five families, for one GPU (on a CPU: a small smoke)")
    parser.add_argument("--config", default=None, help="demo settings YAML (default: the embedded settings of --model)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a demo setting, e.g. --set rl.steps=20 (repeatable)")
    parser.add_argument("--rl-override", dest="rl_overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override of the verl run, e.g. actor_rollout_ref.actor.optim.lr=2e-4")
    parser.add_argument("--engine", choices=sorted(ENGINES), default=None,
                        help="rollout engine of the verl run (default hf; vllm needs `bash scripts/setup.sh --vllm`)")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    settings = args.config or Path(CONFIG_DIR) / SETTINGS[args.model]
    config = load_pipeline_config(settings, args.overrides)
    if config.model.name != "tiny" and config.rl.resolved_device() == "cpu":
        logger.warning("model %s on the CPU: the full run is sized for one GPU (%d RL steps, %d held-out indices in "
                       "all; hours on a CPU, see docs/demo.md). Running its CPU smoke instead (--set overrides "
                       "still apply): %s", config.model.name, config.rl.steps,
                       sum(t.held_out for t in config.tasks), " ".join(cpu_smoke(config)))
        config = load_pipeline_config(settings, [*cpu_smoke(config), *args.overrides])
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
