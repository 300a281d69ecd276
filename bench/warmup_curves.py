"""Warm-up curves: held-out greedy success of each learnable family over the steps of the demo's supervised warm-up.

The demo's own code and settings (``--config``, ``--set`` as for ``agentrl-verl demo``): its environment stack, its
expert demonstrations of every learnable task (jointly, as the demo trains on them), its optimiser settings and its
evaluation through the training agent loop. The warm-up does not stop early: every ``--eval-every`` steps it plays
the first ``--eval-indices`` held-out indices of each learnable task greedily. Usage::

    python -m bench.warmup_curves --config agentrl_verl/presets/demo_multitask.yaml [--steps 300]

Prints the demonstrations per family (count, seconds, tokens of an episode and of its prompt, turns), one row per
evaluation, and as its last line
``key=value`` pairs: seconds per training step (evaluations excluded), per evaluation, and the last success per
family. ``--output FILE`` also writes the curves as JSON.

Results and how to read them: ``docs/results/tiny-learning.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from agentrl_verl.harness.threads import relaunch_with_demo_threads
from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.pipeline.cold_start import supervised_warmup, tokenize_episode
from agentrl_verl.pipeline.evaluation import evaluate_tasks
from agentrl_verl.pipeline.settings import load_pipeline_config
from agentrl_verl.pipeline.stack import Split, sessions, stack_config, task_indices
from env_adapters.demonstrations import generate_demonstrations

logger = logging.getLogger("bench.warmup_curves")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=None, help="demo settings YAML (default: the embedded demo_run.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=300, help="warm-up steps (no early stop)")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-indices", type=int, default=50, help="held-out indices per family per evaluation")
    parser.add_argument("--output", default=None, help="also write the curves to this JSON file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from transformers import AutoTokenizer

    from env_adapters.launcher import EnvStack

    config = load_pipeline_config(args.config, args.overrides)
    learnable = [t for t in config.tasks if t.learnable]
    model_dir = build_tiny_model(spec=config.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with EnvStack(stack_config(learnable), startup_timeout=180) as stack:
        split = Split.of(asyncio.run(task_indices(stack.url, learnable)), learnable)
        demos, made = [], {}
        for spec in learnable:
            began = time.monotonic()
            train = split.train[spec.name][: spec.demonstration_count(config.demonstrations)]
            episodes = generate_demonstrations(spec.family, train, spec.options)
            seconds = time.monotonic() - began
            masks = [tokenize_episode(tokenizer, e.messages, e.tools)[1] for e in episodes]
            made[spec.name] = {"episodes": len(episodes), "seconds": seconds,
                               "tokens_mean": statistics.mean(map(len, masks)), "tokens_max": max(map(len, masks)),
                               "prompt_tokens_mean": statistics.mean(m.index(1) for m in masks),
                               "turns_mean": statistics.mean(sum(m["role"] == "assistant" for m in e.messages)
                                                             for e in episodes)}
            print(f"demonstrations {spec.name}: {len(episodes)} in {seconds:.0f}s; per episode: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in made[spec.name].items() if k not in ("episodes", "seconds")),
                  flush=True)
            demos += episodes
        held_out = {name: indices[: args.eval_indices] for name, indices in split.held_out.items()}
        rows: list[dict[str, float]] = []

        def evaluate(model, part: slice) -> list[bool]:  # the warm-up's check: never screened here (part is all)
            began = time.monotonic()
            results = evaluate_tasks(stack.url, model, tokenizer, {k: v[part] for k, v in held_out.items()},
                                     config.eval, sessions(learnable), seed=config.seed)
            rows.append({"eval_s": time.monotonic() - began,
                         **{name: result.success_rate for name, result in results.items()}})
            print(" ".join(f"{k} {v:.2f}" for k, v in rows[-1].items()), flush=True)
            return [episode["success"] for result in results.values() for episode in result.episodes]

        warmup = dataclasses.replace(config.warmup, max_steps=args.steps, eval_every=args.eval_every,
                                     stop_success=2.0, dense_eval_from=2.0)  # never stop, never evaluate densely
        with tempfile.TemporaryDirectory() as out:
            result = supervised_warmup(model_dir, demos, out, evaluate, warmup)
    for row, history in zip(rows, result.history, strict=True):
        row.update(step=history["step"], loss=history["loss"], seconds=history["seconds"])
    eval_s = sum(row["eval_s"] for row in rows)
    step_s = (rows[-1]["seconds"] - eval_s) / rows[-1]["step"]
    names = [t.name for t in learnable]
    print("\n| step | loss | " + " | ".join(names) + " |\n| --- | --- | " + " | ".join("---" for _ in names) + " |")
    for row in rows:
        print(f"| {row['step']:.0f} | {row['loss']:.3f} | " + " | ".join(f"{row[n]:.2f}" for n in names) + " |")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "demonstrations": made, "curves": rows}, indent=1))
    print(" ".join([f"step_s={step_s:.2f}", f"eval_s={eval_s / len(rows):.1f}",
                    *(f"{n}={rows[-1][n]:.2f}" for n in names)]))


if __name__ == "__main__":
    relaunch_with_demo_threads()  # torch's threads as the demo has them (the warm-up and evaluations run here)
    main()
