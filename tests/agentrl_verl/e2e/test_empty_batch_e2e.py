"""A training step whose every episode failed (``task error``: every row masked) on verl's real ``main_ppo`` (CPU),
under both trainer modes: the step's update is skipped and said so in the metrics, and the run goes on."""

from __future__ import annotations

import pytest

from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.tools.cli import main as agentrl_verl_cli

pytestmark = pytest.mark.slow

EPISODES_PER_STEP = 8  # the cpu_tiny preset: 4 prompts x 2 samples


def failing_chatter(broken_sessions: int) -> dict:
    return {"task": "chatter_task:ChatterTask", "name": "chatter", "concurrency": 16,
            "options": {"rounds": 2, "size": 16, "broken_sessions": broken_sessions}}


@pytest.mark.parametrize("mode", ["agentrl_sync", "agentrl_async"])
def test_a_step_whose_every_episode_failed_is_skipped_and_the_run_goes_on(start_stack, tmp_path, run_main_ppo, mode):
    # agentrl_sync starts a step's episodes only once the step before has trained: its first step holds exactly the
    # first 8 sessions, which fail, and the second trains. agentrl_async admits groups ahead of the steps, so there
    # every session fails and both steps are skipped.
    broken = EPISODES_PER_STEP if mode == "agentrl_sync" else 10**6
    with start_stack([failing_chatter(broken)]) as stack:
        assert agentrl_verl_cli(["make-data", "--controller", stack.url, "--out", str(tmp_path), "--train-size", "16",
                                 "--val-fraction", "0.25", "--seed", "0"]) == 0
        _, steps = run_main_ppo(
            tmp_path, build_tiny_model(), mode,
            "trainer.total_training_steps=2",
            "algorithm.adv_estimator=task_norm_grpo",
            f"trainer.v1.trainer_mode={mode}",
            f"+agentrl.env.url={stack.url}",
            "+agentrl.agent.max_turns=2",
            "+agentrl.agent.max_new_tokens=8",
            "+agentrl.agent.max_total_tokens=300",
            "data.max_prompt_length=160",
            "data.max_response_length=140",
        )
    assert sorted(steps) == [1, 2]
    first = steps[1]
    assert first["agentrl/skipped_batches"] == 1, first
    assert first["agentrl/all/status/task_error"] == EPISODES_PER_STEP, first
    assert "actor/pg_loss" not in first  # no update
    second = steps[2]
    if mode == "agentrl_sync":
        assert second["agentrl/skipped_batches"] == 0 and second.get("agentrl/all/status/task_error", 0) == 0, second
        assert second["actor/pg_loss"] == second["actor/pg_loss"], second  # trained, not NaN
    else:
        assert second["agentrl/skipped_batches"] == 1 and "actor/pg_loss" not in second, second
        assert all(m["async/version"] == step for step, m in steps.items())  # the pipeline's metrics every step
