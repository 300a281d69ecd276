"""The warm-up chain for any model directory: expert demonstrations -> supervised steps -> held-out check -> cache.

:func:`plan_warmup` says where the warmed-up model will be before it exists (a verl run can be launched with that
path and wait for it), :func:`warm_up` builds it there, or finds it in the cache.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrl_verl.pipeline.cold_start import WarmupResult, device_setting, supervised_warmup
from agentrl_verl.pipeline.evaluation import evaluate_tasks
from agentrl_verl.pipeline.settings import PipelineConfig, TaskSpec
from agentrl_verl.pipeline.stack import Split, sessions
from agentrl_verl.pipeline.warmup_cache import build_whole, cache_path, cached_warmup
from env_adapters.demonstrations import generate_demonstrations

logger = logging.getLogger(__name__)

CACHE_NAME = "warmup"
"""The prefix of a cached warm-up model's directory (``<cache>/warmup-<key>``)."""


def warmup_settings(base: Path, config: PipelineConfig, tasks: Sequence[TaskSpec]) -> dict[str, Any]:
    """What shapes the warm-up model when ``tasks`` run, as JSON values (the key of its cached copy): the base
    model, each learnable task's problems, demonstrations, held-out split and check concurrency, the seed, the
    warm-up settings (device resolved) and the evaluation settings its greedy checks use. RL settings, task weights
    and the tasks that are not learnable leave it unchanged."""
    learnable = [{"name": t.name, "family": t.family, "options": t.options, "held_out": t.held_out,
                  "concurrency": sessions([t])[t.name],
                  "demonstrations": t.demonstration_count(config.demonstrations)}
                 for t in tasks if t.learnable]
    checks = {k: v for k, v in asdict(config.eval).items() if k in ("warmup_indices", "max_turns", "max_new_tokens",
                                                                     "max_context")}
    warmup = {**config.warmup.model_settings(), "device": device_setting(config.warmup.device, "warmup.device")}
    return {"base": base.name, "seed": config.seed, "tasks": learnable, "warmup": warmup, "eval": checks}


@dataclass(frozen=True)
class WarmupPlan:
    """Where a warm-up's model goes, known before it is trained.

    ``cache``: the cache root it is kept under (the model is reused where an earlier run left it), or None when the
    run trains its own into ``path``.
    """

    base: Path
    config: PipelineConfig
    tasks: tuple[TaskSpec, ...]
    path: Path
    cache: Path | None


def plan_warmup(base: Path, config: PipelineConfig, tasks: Sequence[TaskSpec], cache: Path,
                output_dir: Path | None = None) -> WarmupPlan:
    """The warm-up of ``base`` on ``tasks``' learnable ones: kept under ``cache`` where ``warmup.reuse`` is on or no
    ``output_dir`` is given, else trained into ``output_dir/warmup_model`` (an earlier run's there is removed)."""
    if config.warmup.reuse or output_dir is None:
        path = cache_path(cache, CACHE_NAME, warmup_settings(base, config, tasks))
        return WarmupPlan(base, config, tuple(tasks), path, cache)
    path = output_dir / "warmup_model"
    shutil.rmtree(path, ignore_errors=True)
    return WarmupPlan(base, config, tuple(tasks), path, None)


@dataclass(frozen=True)
class Warmup:
    """A warmed-up model: what its warm-up did, on how many demonstrations, and whether an earlier run built it."""

    result: WarmupResult
    demonstrations: int
    reused: bool


def warm_up(plan: WarmupPlan, stack_url: str, split: Split) -> Warmup:
    """Build ``plan``'s model, or take it from the cache.

    The learnable tasks' scripted experts play their first ``demonstrations`` training indices; supervised steps
    train ``plan.base`` on the solved episodes until greedy success on the first ``eval.warmup_indices`` held-out
    indices (played through the stack at ``stack_url``) enters the window of ``warmup.stop_success``.
    The model appears at ``plan.path`` whole or not at all.
    """
    from transformers import AutoTokenizer

    config = plan.config
    learnable = [t for t in plan.tasks if t.learnable]
    checked = {t.name: split.held_out[t.name][: config.eval.warmup_indices] for t in learnable}
    tokenizer = AutoTokenizer.from_pretrained(plan.base)

    def check(model, part: slice) -> list[bool]:
        parts = {name: indices[part] for name, indices in checked.items() if indices[part]}
        results = evaluate_tasks(stack_url, model, tokenizer, parts, config.eval, sessions(learnable),
                                 seed=config.seed)
        return [episode["success"] for result in results.values() for episode in result.episodes]

    def build(output: Path) -> dict[str, Any]:
        demos = [d for t in learnable for d in generate_demonstrations(
            t.family, split.train[t.name][: t.demonstration_count(config.demonstrations)], t.options)]
        logger.info("generated %d demonstrations (%s)", len(demos), ", ".join(t.name for t in learnable))
        warm = supervised_warmup(plan.base, demos, output, check, config.warmup)
        return {**{k: v for k, v in asdict(warm).items() if k != "path"}, "demonstrations": len(demos)}

    if plan.cache is not None:
        cached = cached_warmup(plan.cache, CACHE_NAME, warmup_settings(plan.base, config, plan.tasks), build)
        done, reused = dict(cached.metadata), cached.reused
    else:
        done, reused = build_whole(plan.path, build), False
    demonstrations = done.pop("demonstrations")
    result = WarmupResult(path=str(plan.path), **done)
    logger.info("warm-up: %d steps on %s, held-out greedy success %.2f%s", result.steps, result.device,
                result.success, " (reused from the cache)" if reused else "")
    return Warmup(result, demonstrations, reused)
