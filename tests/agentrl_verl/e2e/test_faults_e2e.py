"""Training runs (verl's real ``main_ppo`` on CPU) that lose a part of themselves with episodes in flight: the
environment's controller killed with SIGKILL and started again on its port a few seconds later, then one of its three
workers killed and another frozen (SIGSTOP) while they serve episodes (one asynchronous run takes all of it, and shows
the pipeline's staleness properties through them: each run costs verl's start-up); the driver killed between
checkpoints and resumed."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
import uuid

import pytest

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.tools.cli import main as agentrl_verl_cli

pytestmark = pytest.mark.slow

OUTAGE_S = 3.0
# The controller declares a silent worker down after HEARTBEAT_TIMEOUT_S; its sweep runs every CLEAN_INTERVAL_S.
CONTROLLER = {"heartbeat_timeout": 3, "clean_interval": 0.5}
FREEZE_BOUND_S = 30  # a hang guard for the waits until a worker is declared down (3.5 s by the settings)
# Multi-turn episodes with a delay per environment step: they keep their sessions open long enough to be caught in
# flight, and run on across the asynchronous trainer's weight updates.
WORKER = {"task": "latency_chatter_task:LatencyChatterTask", "name": "chatter", "concurrency": 32,
          "heartbeat_interval": 0.5, "options": {"rounds": 3, "size": 32, "step_latency": {"dist": "fixed", "s": 0.5}}}
STEPS = 4
MAX_STALENESS = 1
BATCH_GROUPS = 4  # the cpu_tiny preset: 4 prompts x 2 samples


def list_sessions(url: str) -> dict[str, dict]:
    with urllib.request.urlopen(f"{url}/api/list_sessions", timeout=5) as resp:
        return json.loads(resp.read())


def running_sessions(url: str) -> list[str]:
    """The worker id of each running session."""
    return [s["worker_id"] for s in list_sessions(url).values() if s["status"] == "running"]


def wait_until(condition, bound_s: float = FREEZE_BOUND_S) -> float:
    """Poll ``condition`` until it holds or ``bound_s`` passed; returns the seconds waited."""
    started = time.monotonic()
    while not condition() and time.monotonic() - started < bound_s:
        time.sleep(0.1)
    return time.monotonic() - started


def test_an_async_run_survives_its_controller_killed_a_worker_killed_and_another_frozen(start_stack, tmp_path,
                                                                                  run_main_ppo):
    killed_in_flight, frozen_in_flight, declared_down_s = [], [], []
    outcome: dict = {}

    def faults() -> None:
        stack.kill_controller()  # the episodes in flight lose their sessions
        time.sleep(OUTAGE_S)
        stack.restart_controller()  # the workers re-register by heartbeat; the episodes are played again
        # Then one worker dies under its sessions (all three serve some): they end at the controller, marked
        # env_lost, and their episodes go to the others. Without the replay of env_lost episodes, a task error is
        # trained.
        while run.is_alive() and len(set(running_sessions(stack.url))) < 3:
            time.sleep(0.1)
        killed_in_flight.append(len(set(running_sessions(stack.url))) == 3)
        stack.kill_worker(0)
        # Then a live worker stops answering with its connections open (a stopped process): once its heartbeats are
        # missed its sessions end marked env_lost and are played again on the other; resumed, it is used again.
        # (First the killed worker is declared down: the running sessions are then the two live workers'.)
        wait_until(lambda: stack.alive_workers() <= 2)
        while run.is_alive() and len(set(running_sessions(stack.url))) < 2:
            time.sleep(0.1)
        frozen_in_flight.append(len(set(running_sessions(stack.url))) == 2)
        frozen = stack.workers[1][1].pid
        os.kill(frozen, signal.SIGSTOP)
        try:
            declared_down_s.append(wait_until(lambda: stack.alive_workers() <= 1))
        finally:
            os.kill(frozen, signal.SIGCONT)

    def train() -> None:
        try:
            outcome["steps"] = run_main_ppo(
                tmp_path, build_tiny_model(), "faults",
                f"trainer.total_training_steps={STEPS}",
                "trainer.test_freq=-1",  # no validation: the sessions caught in flight are training's
                "trainer.val_before_train=false",
                "algorithm.adv_estimator=task_norm_grpo",
                "trainer.v1.trainer_mode=agentrl_async",
                f"+agentrl.async.max_staleness={MAX_STALENESS}",
                "+agentrl.async.stale_policy=wait",
                f"+agentrl.env.url={stack.url}",
                "+agentrl.agent.max_turns=4",
                "+agentrl.agent.max_new_tokens=16",
                "+agentrl.agent.max_total_tokens=600",
                "data.max_prompt_length=160",
                "data.max_response_length=400",
            )[1]
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            outcome["error"] = e

    # Four steps of 0.4 s: episodes outlive a training step (as test_async_e2e.py's).
    options = {"rounds": 4, "size": 16, "step_latency": {"dist": "fixed", "s": 0.4}}
    with start_stack([{**WORKER, "replicas": 3, "options": options}], CONTROLLER) as stack:
        assert agentrl_verl_cli(["make-data", "--controller", stack.url, "--out", str(tmp_path), "--train-size", "32",
                                 "--val-fraction", "0.25", "--seed", "0"]) == 0
        run = threading.Thread(target=train)
        run.start()
        try:
            while run.is_alive() and not running_sessions(stack.url):
                time.sleep(0.1)
            assert run.is_alive(), outcome.get("error")
            faults()
        finally:
            run.join()
        if "error" in outcome:
            raise outcome["error"]
        assert stack.alive_workers() == 2  # the killed worker is gone, the frozen one back
    steps = outcome["steps"]
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert killed_in_flight == [True] and frozen_in_flight == [True]
    # Declared down within the heartbeat bound and a sweep (the hang guard would have let it run to 30 s).
    assert declared_down_s[0] < CONTROLLER["heartbeat_timeout"] + 5, declared_down_s
    # The outage and the lost workers cost attempts, played again on their prompts: every group was trained whole.
    assert sum(m.get("agentrl/chatter/env_retries", 0) for m in steps.values()) > 0
    assert max(m.get("agentrl/chatter/env_unavailable_s", 0) for m in steps.values()) > 0
    for step, m in steps.items():
        assert m["agentrl/all/episodes"] == 2 * BATCH_GROUPS and m.get("agentrl/all/status/task_error", 0) == 0, \
            (step, m)
        # The staleness bound holds for every trained turn, and the wait policy never discards finished work.
        assert m["async/staleness/turn_lag/max"] <= MAX_STALENESS, (step, m)
        assert m["async/staleness/turn_lag/over"] == 0, (step, m)
        assert m["async/total/dropped"] == 0
        assert m["async/throughput/trajectories_per_s"] > 0
        assert m["actor/pg_loss"] == m["actor/pg_loss"]  # not NaN
    # The idle fractions and the buffer depth measure something: the trainer waited for its first batch, rollouts
    # were running, and finished groups waited in the buffer for the trainer.
    assert steps[1]["async/trainer_idle_fraction"] > 0
    assert min(m["async/rollout_idle_fraction"] for m in steps.values()) < 1.0
    assert max(m["async/buffer_depth/max"] for m in steps.values()) >= 1
    # Episodes ran while the trainer trained: the groups admitted with the first batch and trained after it were
    # generated by an older version than the trained one. (Whether an update lands between two turns of one episode
    # depends on how long a step takes against an episode here; test_async_e2e.py's held episodes show it by
    # construction.)
    assert max(m["async/staleness/turn_lag/mean"] for m in steps.values()) > 0
    # Admission never waited for a step boundary: by the end of step 1 more groups had started than it took. Nor
    # did any group start for a step after the last, and an episode played again is no new group: the run generated
    # exactly what it trained.
    assert steps[1]["async/total/admitted"] > BATCH_GROUPS
    assert steps[STEPS]["async/total/admitted"] == STEPS * BATCH_GROUPS
    assert sum(m["async/resumed_turns"] for m in steps.values()) == 0  # no interruption: updates land between turns


@pytest.mark.timeout(1500)  # two runs of up to 540 s each (conftest's hang guard) and up to 300 s between them
def test_an_async_run_killed_between_checkpoints_resumes_where_it_saved(start_stack, tmp_path, run_main_ppo):
    # The paper's configuration: agentrl_async with cross-policy sampling. Its driver is killed with SIGKILL after the
    # checkpoint of step 2, with step 3's groups in flight; the same command with resume_mode=auto trains steps 3
    # and 4 only, its stale copy refreshed to the resumed weights at once, the bound kept; nothing of the dead run is
    # left (its processes go with the driver, its sessions end at the controller's idle timeout). The groups the
    # checkpoint holds (verl saves TransferQueue with it) are played again, not lost, and the pacer counts them.
    run_id = uuid.uuid4().hex
    overrides = (
        "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.resume_mode=auto",
        "trainer.test_freq=-1", "trainer.val_before_train=false",
        "algorithm.adv_estimator=task_norm_grpo", "trainer.v1.trainer_mode=agentrl_async",
        "+agentrl.async.max_staleness=1", "+agentrl.agent.max_turns=3", "+agentrl.agent.max_new_tokens=24",
        "+agentrl.agent.max_total_tokens=400", "data.max_prompt_length=160", "data.max_response_length=160",
        "+agentrl.cross_policy.enable=true", "+agentrl.cross_policy.stale_refresh_steps=2",
        "+agentrl.cross_policy.stale_replicas=1", "+agentrl.cross_policy.stale_ratio=0.5",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=ray_object_store", "ray_kwargs.ray_init.num_gpus=2",
    )
    checkpoint = tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    in_flight: list[int] = []

    def kill_after_step_2(driver) -> None:
        def watch() -> None:
            while driver.poll() is None:
                saved = checkpoint.read_text().strip() if checkpoint.exists() else ""
                running = [int(i) for i, s in list_sessions(stack.url).items() if s["status"] == "running"] \
                    if saved == "2" else []
                if running:
                    in_flight.extend(running)
                    driver.send_signal(signal.SIGKILL)
                    return
                time.sleep(0.2)

        threading.Thread(target=watch, daemon=True).start()

    with start_stack([{**WORKER, "options": {**WORKER["options"], "size": 64}}],
                     controller={"session_idle_timeout": 5}) as stack:
        assert agentrl_verl_cli(["make-data", "--controller", stack.url, "--out", str(tmp_path), "--train-size", "64",
                                 "--val-fraction", "0.1", "--seed", "0"]) == 0
        overrides = (*overrides, f"+agentrl.env.url={stack.url}")
        _, killed = run_main_ppo(tmp_path, build_tiny_model(), "async_killed", *overrides, started=kill_after_step_2,
                                 returncode=-signal.SIGKILL, env={vllm_cpu.RUN_ID_ENV: run_id})
        # Killed with sessions running after the checkpoint of step 2 (its console line may not be out yet).
        assert in_flight and set(killed) <= {1, 2} and checkpoint.read_text().strip() == "2"
        killed_at = time.monotonic()
        while vllm_cpu.run_processes(run_id) and time.monotonic() < killed_at + 300:
            time.sleep(1)
        assert vllm_cpu.run_processes(run_id) == []  # Ray's processes and the agent loop went with the driver
        log, resumed = run_main_ppo(tmp_path, build_tiny_model(), "async_resumed", *overrides)
        assert sorted(resumed) == [3, 4]  # exactly the configured steps in all
        sessions = list_sessions(stack.url)
    assert not any(sessions.get(str(s), {}).get("status") == "running" for s in in_flight)
    for step, m in resumed.items():
        assert m["agentrl/all/episodes"] == 8 and m.get("agentrl/all/status/task_error", 0) == 0, (step, m)
        assert m["async/staleness/turn_lag/over"] == 0, (step, m)  # no turn older than the bound trained
    # The stale copy starts equal to the resumed actor: refreshed at init to the checkpoint's version. (Its turns in
    # step 3 may still lag: finished groups of the dead run, saved with its checkpoint, are trained as they were.)
    assert resumed[3]["cross_policy/stale_version"] == 2, resumed[3]
    restored = int(re.search(r"Restored (\d+) training prompt groups", log).group(1))
    assert restored > 0  # groups admitted by the dead run, saved with its checkpoint
    # Two steps of 4 groups: the restored ones and exactly as many new ones as were missing, none dropped.
    assert resumed[4]["async/total/admitted"] + restored == 2 * 4, (restored, resumed[4])
    assert resumed[4]["async/total/dropped"] == 0, resumed[4]
