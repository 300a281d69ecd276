"""verl's real ``main_ppo`` (V1 trainer, FSDP2 engines, TransferQueue, Ray) on CPU through our plugin.

Each test runs ``python -m verl.trainer.main_ppo`` with the ``cpu_tiny`` preset in a subprocess (its own Ray
cluster in a private temp dir, stopped when the driver exits) and reads the per-step metrics it prints.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl_verl.harness.tiny_model import build_tiny_model

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


def test_grpo_trains_validates_and_checkpoints_with_rollout_following_actor(workdir, model_path, run_main_ppo):
    _, steps = run_main_ppo(
        workdir, model_path, "grpo",
        "trainer.total_training_steps=2", "trainer.val_before_train=true", "trainer.test_freq=2",
        "trainer.save_freq=2", "trainer.resume_mode=auto",
    )
    assert trained_steps(steps) == [1, 2]
    assert any(key.startswith("val-") for key in steps[0]), "no validation metrics before training"
    assert any(key.startswith("val-") for key in steps[2]), "no validation metrics at test_freq"
    for step in (1, 2):
        metrics = steps[step]
        # The actor really updates...
        assert metrics["actor/grad_norm"] > 0, step
        # ...and after each weight sync the hf rollout samples from the actor's weights: its log-probs equal
        # the actor's recomputed ones up to float noise.
        assert metrics["training/rollout_probs_diff_valid"] == 1.0
        assert metrics["training/rollout_probs_diff_max"] < 1e-3, (step, metrics["training/rollout_probs_diff_max"])
    assert (workdir / "ckpt" / "global_step_2" / "actor").is_dir()
    assert (workdir / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"

    # Resume: the run loads global_step_2 and trains only step 3.
    _, steps = run_main_ppo(
        workdir, model_path, "resume",
        "trainer.total_training_steps=3", "trainer.resume_mode=auto", "trainer.save_freq=-1",
    )
    assert trained_steps(steps) == [3], f"resumed run trained steps {trained_steps(steps)}"
    assert steps[3]["training/rollout_probs_diff_max"] < 1e-3


def test_ppo_with_critic_and_reference_policy_and_a_rollout_that_diverges_without_weight_sync(workdir, model_path,
                                                                                             run_main_ppo):
    # One run for two checks (each run costs verl's start-up): PPO's critic and reference policy work through the
    # plugin, and with weight sync off the rollout keeps its initial weights while the actor moves.
    _, steps = run_main_ppo(
        workdir, model_path, "ppo_nosync",
        "trainer.total_training_steps=2", "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true",
        f"critic.model.path={model_path}",
        "actor_rollout_ref.rollout.engine_kwargs.hf.sync_weights=false",
        "actor_rollout_ref.actor.optim.lr=2e-2",  # a big first update, so that the frozen rollout falls far behind
    )
    for step in (1, 2):
        assert steps[step]["critic/vf_loss"] == steps[step]["critic/vf_loss"], step  # not NaN
        assert "actor/kl_loss" in steps[step], step
    # Step 1 samples from the initial weights, which the actor still has; by step 2 the actor moved on while the
    # rollout did not (the max differs in probability, small for a near-uniform random model: compare ratios).
    synced, stale = (steps[s]["training/rollout_probs_diff_max"] for s in (1, 2))
    assert synced < 1e-4, synced
    assert stale > 10 * max(synced, 1e-5), (synced, stale)
    # The weight version reported by the server stays at the initial one, so samples count as stale.
    assert steps[2]["training/off_policy/trajectory_staleness/max"] >= 1
