"""Held-out evaluation of a model directory through the stack, with the agent loop that trains."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl_verl.pipeline.cold_start import release_device_memory
from agentrl_verl.pipeline.settings import EvalSpec
from agentrl_verl.tools.evaluate import EvalResult, evaluate_model
from env_adapters.protocol import Index

logger = logging.getLogger(__name__)

MODES = ("greedy", "sampled")
"""Evaluation modes: greedy decoding, and sampling at :attr:`EvalSpec.temperature` (seeded)."""


def evaluate_tasks(url: str, model, tokenizer, splits: Mapping[str, list[Index]], spec: EvalSpec,
                   sessions: Mapping[str, int], greedy: bool = True, seed: int = 0) -> dict[str, EvalResult]:
    """Play ``model`` on each task's indices in ``splits`` through the stack at ``url`` with the training agent loop,
    at most ``sessions[task]`` episodes at once (the task's worker concurrency)."""
    return evaluate_model(url, model, tokenizer, dict(splits), greedy=greedy, temperature=spec.temperature,
                          max_turns=spec.max_turns, max_new_tokens=spec.max_new_tokens, max_context=spec.max_context,
                          concurrency=dict(sessions), seed=seed)


def evaluate_held_out(url: str, model_dir: str | Path, tokenizer, held_out: Mapping[str, list[Index]],
                      spec: EvalSpec, sessions: Mapping[str, int], device: str = "cpu", seed: int = 0,
                      modes: Sequence[str] | None = None,
                      repeats: Mapping[str, int] | None = None) -> dict[str, dict[str, EvalResult]]:
    """Load the model in ``model_dir`` on ``device`` and play every held-out index of each task once per mode.

    Args:
        url: The controller of the stack serving the tasks.
        model_dir: A Hugging Face model directory.
        tokenizer: The tokenizer the model was trained with.
        held_out: Indices by task name.
        spec: Turn and token limits and the sampling temperature.
        sessions: Episodes at once, by task name.
        device: A torch device name.
        seed: The sampling seed (the same for every model, so that their episodes pair up).
        modes: Some of :data:`MODES`; default ``greedy``, and ``sampled`` where :attr:`EvalSpec.sampled`.
        repeats: By task name, how many times the sampled mode plays each index (default once).

    Returns:
        Per mode, per task, the episodes and their outcome.

    Raises:
        ValueError: an unknown mode.
    """
    import torch
    from transformers import AutoModelForCausalLM

    modes = list(modes) if modes is not None else ["greedy", *(["sampled"] if spec.sampled else [])]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"evaluation modes {unknown}: use {' or '.join(MODES)}")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    repeated = {task: indices * (repeats or {}).get(task, 1) for task, indices in held_out.items()}
    results = {mode: evaluate_tasks(url, model, tokenizer, held_out if mode == "greedy" else repeated, spec, sessions,
                                    greedy=mode == "greedy", seed=seed) for mode in modes}
    del model
    release_device_memory(device)
    for mode, per_task in results.items():
        logger.info("held-out %s success: %s (%s)", mode, ", ".join(f"{k} {v.success_rate:.3f}"
                                                                   for k, v in per_task.items()), Path(model_dir).name)
    return results


def standard_error(success: float, episodes: int) -> float:
    """The binomial standard error of a success rate over ``episodes`` independent episodes."""
    return math.sqrt(success * (1.0 - success) / episodes) if episodes else 0.0


def held_out_changes(before: dict[str, dict[str, EvalResult]], after: dict[str, dict[str, EvalResult]] | None,
                     learnable: list[str], base: dict[str, dict[str, EvalResult]] | None = None) -> dict[str, Any]:
    """Per task and evaluation mode: held-out success (with its standard error) and mean reward before RL, after RL
    with the change when ``after`` exists (a run stopped early has only ``before``), and of the model the run started
    from, before its warm-up, when ``base`` exists."""
    tasks: dict[str, Any] = {}
    for mode, results in before.items():
        for task, result in results.items():
            n = len(result.episodes)
            row = {"success_before": result.success_rate, "se_before": standard_error(result.success_rate, n),
                   "reward_before": result.mean_reward}
            if base is not None:
                zero_shot = base[mode][task]
                row.update(success_base=zero_shot.success_rate,
                           se_base=standard_error(zero_shot.success_rate, len(zero_shot.episodes)))
            if after is not None:
                post = after[mode][task]
                row.update(success_after=post.success_rate, se_after=standard_error(post.success_rate, n),
                           success_change=post.success_rate - result.success_rate, reward_after=post.mean_reward)
            tasks.setdefault(task, {"learnable": task in learnable, "held_out": n})[mode] = row
    return tasks
