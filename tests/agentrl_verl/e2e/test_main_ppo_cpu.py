"""verl's real ``main_ppo`` (V1 trainer, FSDP2 engines, TransferQueue, Ray) on CPU through our plugin.

Each test runs ``python -m verl.trainer.main_ppo`` with the ``cpu_tiny`` preset in a subprocess (its own Ray
cluster in a private temp dir, stopped when the driver exits) and reads the per-step metrics it prints.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl_verl.models.tiny import build_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, arith_data) -> Path:
    root = tmp_path_factory.mktemp("cpu_e2e")
    arith_data.make_parquet(root / "train.parquet", num_rows=16, seed=0)
    arith_data.make_parquet(root / "val.parquet", num_rows=4, seed=1)
    return root


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return build_tiny_model()


def trained_steps(steps: dict[int, dict[str, float]]) -> list[int]:
    """Steps that updated the actor (validation-only lines, e.g. step 0, have no actor metrics)."""
    return sorted(step for step, metrics in steps.items() if "actor/grad_norm" in metrics)


def test_ppo_with_critic_and_reference_policy_trains_validates_and_checkpoints_with_rollout_following_actor(
        workdir, model_path, run_main_ppo):
    # One run for what verl's own trainer must do through the plugin (each run costs verl's start-up): PPO's critic
    # and reference policy, validation before training and at test_freq, a checkpoint, and the hf rollout sampling
    # from the actor's weights after each sync. Resuming from a checkpoint is shown for the paper's asynchronous
    # configuration (test_faults_e2e.py); a rollout that keeps its initial weights, by the adapter's unit test.
    _, steps = run_main_ppo(
        workdir, model_path, "ppo",
        "trainer.total_training_steps=2", "trainer.val_before_train=true", "trainer.test_freq=2",
        "trainer.save_freq=2", "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true",
        f"critic.model.path={model_path}", agentrl_agent=False,
    )
    assert trained_steps(steps) == [1, 2]
    assert any(key.startswith("val-") for key in steps[0]), "no validation metrics before training"
    assert any(key.startswith("val-") for key in steps[2]), "no validation metrics at test_freq"
    for step in (1, 2):
        metrics = steps[step]
        # The actor and the critic really update, with the reference policy's KL in the loss...
        assert metrics["actor/grad_norm"] > 0, step
        assert metrics["critic/vf_loss"] == metrics["critic/vf_loss"], step  # not NaN
        assert "actor/kl_loss" in metrics, step
        # ...and after each weight sync the hf rollout samples from the actor's weights: its log-probs equal
        # the actor's recomputed ones up to fp32 noise (~1e-9 here; an actor in verl's default bf16 mixed
        # precision is 2e-5 off on this model, and up to 0.5 on SmolLM2).
        assert metrics["training/rollout_probs_diff_valid"] == 1.0
        assert metrics["training/rollout_probs_diff_max"] < 1e-6, (step, metrics["training/rollout_probs_diff_max"])
    assert (workdir / "ckpt" / "global_step_2" / "actor").is_dir()
    assert (workdir / "ckpt" / "global_step_2" / "critic").is_dir()
    assert (workdir / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
