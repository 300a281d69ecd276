"""AgentRL on verl's real ``main_ppo`` (CPU): the ``agentrl_agent`` loop against a real environment stack of two
tasks, the ``task_norm_grpo`` estimator and the ``agentrl_sync`` trainer mode, with per-task metrics logged
through verl's tracking.

The stack (controller + one worker per task, subprocesses) runs ``calc`` and the ``chatter`` test task (many
turns for any model); ``make-data`` builds the datasets from the running controller.
"""

from __future__ import annotations

import pandas as pd
import pytest

from agentrl_verl.harness.tiny_model import build_tiny_model
from agentrl_verl.tools.cli import main as agentrl_verl_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(start_stack):
    workers = [{"task": "calc", "name": "calc", "concurrency": 8, "options": {"size": 32}},
               {"task": "chatter_task:ChatterTask", "name": "chatter", "concurrency": 8,
                "options": {"rounds": 3, "size": 8}}]
    with start_stack(workers) as env:
        yield env


def test_two_tasks_train_with_task_normalised_advantages(stack, tmp_path, run_main_ppo):
    assert agentrl_verl_cli(["make-data", "--controller", stack.url, "--out", str(tmp_path), "--train-size", "16",
                             "--val-fraction", "0.25", "--seed", "0"]) == 0
    assert set(pd.read_parquet(tmp_path / "train.parquet")["data_source"]) == {"calc", "chatter"}

    _, steps = run_main_ppo(
        tmp_path, build_tiny_model(), "agentrl",
        "trainer.total_training_steps=3",
        "algorithm.adv_estimator=task_norm_grpo",
        "trainer.v1.trainer_mode=agentrl_sync",
        f"+agentrl.env.url={stack.url}",
        "+agentrl.task_adv_norm=token",
        "+agentrl.agent.max_turns=3",
        "+agentrl.agent.max_new_tokens=24",
        "+agentrl.agent.max_total_tokens=400",
        "data.max_prompt_length=160",
        "data.max_response_length=160",
    )
    assert sorted(steps) == [1, 2, 3]
    seen = set()
    for step, m in steps.items():
        assert m["agentrl/all/episodes"] == 8, (step, m)  # 4 prompts x n=2
        statuses = sum(v for k, v in m.items() if k.startswith("agentrl/all/status/"))
        assert statuses == 8 and m.get("agentrl/all/status/task_error", 0) == 0, (step, m)
        for task in ("calc", "chatter"):
            if f"agentrl/{task}/episodes" in m:
                seen.add(task)
                for name in ("reward", "success_rate", "turns", "generated_tokens", "env_tokens", "env_latency_s"):
                    assert f"agentrl/{task}/{name}" in m, (step, task, name)
        if "agentrl/chatter/turns" in m:
            assert m["agentrl/chatter/turns"] > 1  # multi-turn episodes really ran
        assert m["actor/pg_loss"] == m["actor/pg_loss"]  # not NaN
    assert seen == {"calc", "chatter"}
