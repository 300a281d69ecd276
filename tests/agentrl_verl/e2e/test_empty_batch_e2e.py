"""A training step whose every episode failed (``task error``: every row masked) on verl's real ``main_ppo`` (CPU):
the step's update is skipped and said so in the metrics, and the next step trains.

``agentrl_sync`` starts a step's episodes only once the step before has trained, so its first step holds exactly the
first sessions, which fail. The asynchronous trainer skips through the same mixin, right above verl's trainer in both
modes (``tests/agentrl_verl/core/test_trainer.py``); which of its admitted groups make up a step is not fixed, so a
run of its own could only fail every session.
"""

from __future__ import annotations

import pytest

from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.tools.cli import main as agentrl_verl_cli

pytestmark = pytest.mark.slow

EPISODES_PER_STEP = 8  # the cpu_tiny preset: 4 prompts x 2 samples


def test_a_step_whose_every_episode_failed_is_skipped_and_the_next_trains(start_stack, tmp_path, run_main_ppo):
    worker = {"task": "chatter_task:ChatterTask", "name": "chatter", "concurrency": 16,
              "options": {"rounds": 2, "size": 16, "broken_sessions": EPISODES_PER_STEP}}
    with start_stack([worker]) as stack:
        assert agentrl_verl_cli(["make-data", "--controller", stack.url, "--out", str(tmp_path), "--train-size", "16",
                                 "--val-fraction", "0.25", "--seed", "0"]) == 0
        _, steps = run_main_ppo(
            tmp_path, build_tiny_model(), "empty_batch",
            "trainer.total_training_steps=2",
            "algorithm.adv_estimator=task_norm_grpo",
            "trainer.v1.trainer_mode=agentrl_sync",
            f"+agentrl.env.url={stack.url}",
            "+agentrl.agent.max_turns=2",
            "+agentrl.agent.max_new_tokens=8",
            "+agentrl.agent.max_total_tokens=300",
            "data.max_prompt_length=160",
            "data.max_response_length=140",
        )
    assert sorted(steps) == [1, 2]
    first, second = steps[1], steps[2]
    assert first["agentrl/skipped_batches"] == 1, first
    assert first["agentrl/all/status/task_error"] == EPISODES_PER_STEP, first
    assert "actor/pg_loss" not in first  # no update
    assert second["agentrl/skipped_batches"] == 0 and second.get("agentrl/all/status/task_error", 0) == 0, second
    assert second["actor/pg_loss"] == second["actor/pg_loss"], second  # trained, not NaN
