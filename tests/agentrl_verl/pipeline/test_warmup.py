"""What keys a cached warm-up model: the settings that shape it, and only those."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl_verl.pipeline.settings import load_pipeline_config
from agentrl_verl.pipeline.warmup import warmup_settings
from agentrl_verl.pipeline.warmup_cache import cache_key
from agentrl_verl.presets import CONFIG_DIR

MULTITASK = Path(CONFIG_DIR) / "demo_multitask.yaml"


@pytest.mark.parametrize("override", ["seed=1", "tasks.0.demonstrations=10",
                                      "tasks.0.held_out=30", "tasks.0.options.size=4000", "tasks.0.concurrency=8",
                                      "warmup.lr=0.01", "warmup.seed=1", "warmup.max_steps=10",
                                      "eval.warmup_indices=5", "eval.max_context=512", "eval.max_turns=2",
                                      "eval.max_new_tokens=32"])
def test_the_warm_up_cache_key_changes_with_each_setting_that_shapes_the_model(override):
    base, config = Path("tiny-qwen2-abc"), load_pipeline_config(MULTITASK)
    changed = load_pipeline_config(MULTITASK, [override])
    assert cache_key(warmup_settings(base, changed, changed.tasks)) != cache_key(
        warmup_settings(base, config, config.tasks))


@pytest.mark.parametrize("override", ["rl.steps=3", "rl.overrides=[actor_rollout_ref.actor.optim.lr=2e-4]",
                                      "rl.engine=vllm", "rl.stall_s=60", "tasks.0.weight=3", "warmup.reuse=true",
                                      "eval.sampled=false", "eval.temperature=1.0"])
def test_the_warm_up_cache_key_ignores_the_settings_that_do_not_shape_the_model(override):
    base, config = Path("tiny-qwen2-abc"), load_pipeline_config(MULTITASK)
    changed = load_pipeline_config(MULTITASK, [override])
    assert cache_key(warmup_settings(base, changed, changed.tasks)) == cache_key(
        warmup_settings(base, config, config.tasks))


def test_the_warm_up_cache_key_follows_the_base_model_and_the_learnable_tasks_only():
    config = load_pipeline_config()  # calc learnable; db, os, kg, webshop not
    key = cache_key(warmup_settings(Path("tiny-qwen2-abc"), config, config.tasks))
    assert cache_key(warmup_settings(Path("tiny-qwen2-def"), config, config.tasks)) != key
    without_os = [t for t in config.tasks if t.name != "os"]  # no Docker here: os is left out, calc still learns
    assert cache_key(warmup_settings(Path("tiny-qwen2-abc"), config, without_os)) == key
    kg = load_pipeline_config(None, ["tasks.3.learnable=true"])
    assert cache_key(warmup_settings(Path("tiny-qwen2-abc"), kg, kg.tasks)) != key
    fewer = load_pipeline_config(None, ["demonstrations=100"])  # calc's count: it has none of its own
    assert cache_key(warmup_settings(Path("tiny-qwen2-abc"), fewer, fewer.tasks)) != key
    multitask = load_pipeline_config(MULTITASK, ["demonstrations=100"])  # each task has its own: no change
    assert (cache_key(warmup_settings(Path("tiny-qwen2-abc"), multitask, multitask.tasks))
            == cache_key(warmup_settings(Path("tiny-qwen2-abc"), load_pipeline_config(MULTITASK),
                                         load_pipeline_config(MULTITASK).tasks)))
