"""The ``agentrl_async`` trainer mode on verl's real ``main_ppo`` (CPU): episodes keep running across weight updates,
every turn carries its weight version, and the staleness bound holds.

The environment is a multi-turn task with a heavy-tailed delay per environment step (some groups finish late), so
episodes last longer than a training step (for the interrupted generations, a task whose episodes wait for the first
update, which lands while one of their turns is decoding: ``hold_update.py``); the ``agentrl_agent`` loop plays it and
``task_norm_grpo`` trains on it. Each stale policy runs once: ``drop`` with interrupted and resumed generations and
``keep`` with verl's importance-weight correction here, ``wait`` (updates between turns) in ``test_faults_e2e.py``,
whose run loses its controller and a worker on the way (each run costs verl's start-up).
"""

from __future__ import annotations

import pytest

from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.tools.cli import main as agentrl_verl_cli

pytestmark = pytest.mark.slow

STEPS = 4
MAX_STALENESS = 1
EPISODES_PER_STEP = 8  # the cpu_tiny preset: 4 prompts x 2 samples


def chatter_worker(step_latency: dict) -> dict:
    return {"task": "latency_chatter_task:LatencyChatterTask", "name": "chatter", "concurrency": 32,
            "options": {"rounds": 4, "size": 16, "step_latency": step_latency}}


@pytest.fixture(scope="module")
def tail_stack(start_stack):
    """Heavy-tailed environment steps: episodes finish far out of order, so some groups outlive the bound."""
    with start_stack([chatter_worker({"dist": "lognormal", "median_s": 0.2, "sigma": 1.5, "max_s": 4.0})]) as env:
        yield env


def run_async(stack, workdir, run_main_ppo, *overrides: str, max_staleness: int = MAX_STALENESS,
              max_new_tokens: int = 16, env: dict[str, str] | None = None) -> dict[int, dict]:
    """``STEPS`` steps of ``agentrl_async`` (the preset's 4 groups of 2) on the chatter task; per-step metrics."""
    assert agentrl_verl_cli(["make-data", "--controller", stack.url, "--out", str(workdir), "--train-size", "32",
                             "--val-fraction", "0.25", "--seed", "0"]) == 0
    _, steps = run_main_ppo(
        workdir, build_tiny_model(), "agentrl_async",
        f"trainer.total_training_steps={STEPS}",
        "algorithm.adv_estimator=task_norm_grpo",
        "trainer.v1.trainer_mode=agentrl_async",
        f"+agentrl.async.max_staleness={max_staleness}",
        f"+agentrl.env.url={stack.url}",
        "+agentrl.agent.max_turns=4",
        f"+agentrl.agent.max_new_tokens={max_new_tokens}",
        "+agentrl.agent.max_total_tokens=600",
        "data.max_prompt_length=160",
        "data.max_response_length=400",
        *overrides,
        env=env,
    )
    assert sorted(steps) == list(range(1, STEPS + 1))
    return steps


def test_interrupted_generations_resume_and_drop_keeps_the_bound(held_stack, tmp_path, run_main_ppo,
                                                                 hold_first_update):
    # Many episodes in flight (a bound of 2: up to 12 groups) with turns of 96 tokens (ignore_eos). The first batch
    # is the free prompts' groups; the others' episodes wait at their first step until the first update, which the
    # hook lets land only once one of their turns is decoding with three quarters of its tokens to come: an update
    # that aborts a running generation by construction, not by timing.
    stack, release = held_stack
    steps = run_async(stack, tmp_path, run_main_ppo, "+agentrl.async.stale_policy=drop",
                      "+agentrl.async.interrupt=true", "actor_rollout_ref.rollout.ignore_eos=true", max_staleness=2,
                      max_new_tokens=96, env=hold_first_update(release))
    assert release.exists()
    for step, m in steps.items():
        # Dropping beyond the bound is per group, on the oldest token of every turn (a resumed turn included).
        assert m["async/staleness/turn_lag/over"] == 0, (step, m)
        assert m["agentrl/all/episodes"] == EPISODES_PER_STEP, (step, m)  # dropped groups were replaced, never left out
        assert m["actor/pg_loss"] == m["actor/pg_loss"]
    # Updates aborted running generations, which went on under the new weights within the same episode.
    assert sum(m["async/resumed_turns"] for m in steps.values()) > 0
    # Step 2 trains held groups: each played its first turn before the first update and its later ones after it.
    assert steps[2]["async/staleness/multi_version_trajectories"] > 0, steps[2]
    assert steps[STEPS]["async/total/dropped"] == sum(m["async/groups/dropped"] for m in steps.values())


def test_keep_policy_trains_late_groups_with_importance_correction(tail_stack, tmp_path, run_main_ppo):
    steps = run_async(tail_stack, tmp_path, run_main_ppo, "+agentrl.async.stale_policy=keep",
                      "algorithm.rollout_correction.rollout_is=token")
    for step, m in steps.items():
        # Every turn beyond the bound belongs to a group the policy kept and counted.
        assert (m["async/staleness/turn_lag/over"] > 0) == (m["async/groups/stale_kept"] > 0), (step, m)
        assert m["agentrl/all/episodes"] == EPISODES_PER_STEP and m["async/groups/dropped"] == 0, (step, m)
        # verl's truncated importance weights against the behaviour log-probs of the agent loop.
        assert "rollout_corr/rollout_is_mean" in m, (step, sorted(m))
        assert m["actor/pg_loss"] == m["actor/pg_loss"]
    assert steps[STEPS]["async/total/stale_kept"] == sum(m["async/groups/stale_kept"] for m in steps.values())
