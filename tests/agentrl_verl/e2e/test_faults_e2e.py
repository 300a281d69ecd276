"""A training run (verl's real ``main_ppo`` on CPU) whose environment fails under it while episodes are in flight:
the controller killed with SIGKILL and started again on its port a few seconds later, then one of its two workers
killed while both serve the episodes played again. One run takes both faults (each run costs verl's start-up)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from agentrl_verl.harness.tiny_model import build_tiny_model
from agentrl_verl.tools.cli import main as agentrl_verl_cli

pytestmark = pytest.mark.slow

OUTAGE_S = 3.0
# Steps of half a second: an episode's three steps keep its session open long enough to be caught in flight.
WORKER = {"task": "latency_chatter_task:LatencyChatterTask", "name": "chatter", "concurrency": 32,
          "heartbeat_interval": 0.5, "options": {"rounds": 3, "size": 32, "step_latency": {"dist": "fixed", "s": 0.5}}}


def running_sessions(url: str) -> list[str]:
    """The worker id of each running session."""
    with urllib.request.urlopen(f"{url}/api/list_sessions", timeout=5) as resp:
        return [s["worker_id"] for s in json.loads(resp.read()).values() if s["status"] == "running"]


def train_through(fault, stack, workdir, run_main_ppo, name: str) -> dict[int, dict]:
    """Two steps of ``main_ppo`` on ``stack``; ``fault(run)`` runs (given the training thread) once sessions are in
    flight. Returns the metrics, after checking that every group was trained whole: the lost episodes were played
    again on their prompts, none trained as an error."""
    assert agentrl_verl_cli(["make-data", "--controller", stack.url, "--out", str(workdir), "--train-size", "16",
                             "--val-fraction", "0.25", "--seed", "0"]) == 0
    outcome: dict = {}

    def train() -> None:
        try:
            outcome["steps"] = run_main_ppo(
                workdir, build_tiny_model(), name,
                "trainer.total_training_steps=2",
                "trainer.test_freq=-1",  # no validation: the sessions caught in flight are training's
                "trainer.val_before_train=false",
                "algorithm.adv_estimator=task_norm_grpo",
                "trainer.v1.trainer_mode=agentrl_sync",
                f"+agentrl.env.url={stack.url}",
                "+agentrl.agent.max_turns=3",
                "+agentrl.agent.max_new_tokens=24",
                "+agentrl.agent.max_total_tokens=400",
                "data.max_prompt_length=160",
                "data.max_response_length=160",
            )[1]
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            outcome["error"] = e

    run = threading.Thread(target=train)
    run.start()
    try:
        while run.is_alive() and not running_sessions(stack.url):
            time.sleep(0.1)
        assert run.is_alive(), outcome.get("error")
        fault(run)
    finally:
        run.join()
    if "error" in outcome:
        raise outcome["error"]
    steps = outcome["steps"]
    assert sorted(steps) == [1, 2]
    for step, m in steps.items():
        assert m["agentrl/all/episodes"] == 8 and m.get("agentrl/all/status/task_error", 0) == 0, (step, m)
    return steps


def test_a_run_survives_its_controller_killed_and_then_a_worker_killed_mid_episode(start_stack, tmp_path,
                                                                                   run_main_ppo):
    killed_in_flight = []

    def faults(run: threading.Thread) -> None:
        stack.kill_controller()  # the episodes in flight lose their sessions
        time.sleep(OUTAGE_S)
        stack.restart_controller()  # the workers re-register by heartbeat; the episodes are played again
        # Then one worker dies under its sessions (both serve some): they end at the controller, marked env_lost, and
        # their episodes go to the other worker. Without the replay of env_lost episodes, a task error is trained.
        while run.is_alive() and len(set(running_sessions(stack.url))) < 2:
            time.sleep(0.1)
        killed_in_flight.append(len(set(running_sessions(stack.url))) == 2)
        stack.kill_worker(0)

    with start_stack([{**WORKER, "replicas": 2}]) as stack:
        steps = train_through(faults, stack, tmp_path, run_main_ppo, "faults")
        assert stack.alive_workers() == 1
    assert killed_in_flight == [True]
    assert steps[1]["agentrl/chatter/env_retries"] > 0, steps[1]
    assert steps[1]["agentrl/chatter/env_unavailable_s"] > 0, steps[1]
