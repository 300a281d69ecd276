"""The launch and supervision of verl's main_ppo (a stand-in process plays main_ppo), and the RL preset's checks."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.pipeline.launch import (
    RAY_START_TIMEOUT,
    RLRun,
    RLStopped,
    check_rl_settings,
    format_progress,
    rl_command,
    rl_environment,
    run_main_ppo,
)
from agentrl_verl.pipeline.settings import RLSpec, load_pipeline_config


def test_progress_line_shows_reward_and_success_per_task():
    metrics = {"agentrl/calc/reward": 0.5, "agentrl/calc/success_rate": 0.625, "agentrl/db/reward": -0.2,
               "agentrl/db/success_rate": 0.0}
    line = format_progress(3, 40, metrics, ["calc", "db", "os"], 61.2)
    assert line == "RL step 3/40 (61s) | calc: reward +0.50 success 0.62 | db: reward -0.20 success 0.00"


def test_rl_processes_get_every_core_at_normal_priority_with_passive_threads(monkeypatch, tmp_path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("TQ_NUM_THREADS", raising=False)
    env = rl_environment(tmp_path / "m.jsonl")
    assert env["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0))) and env["RAY_worker_niceness"] == "0"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["TQ_NUM_THREADS"] == env["OMP_NUM_THREADS"]
    assert env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "m.jsonl")
    assert env["RAY_prestart_worker_first_driver"] == "0"  # no idle Ray worker per core that nothing uses
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's settings win
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    env = rl_environment(tmp_path / "m.jsonl")
    assert (env["OMP_NUM_THREADS"], env["OMP_WAIT_POLICY"]) == ("3", "ACTIVE")


def _fake_run(tmp_path: Path, body: str) -> list[str]:
    """A stand-in for main_ppo: writes verl's metrics file as told and prints step lines (and a child process, whose
    command line names the script, so that ``live_processes(str(tmp_path))`` finds both and nothing of another
    test's)."""
    script = tmp_path / "fake_main_ppo.py"
    script.write_text("import json, os, subprocess, sys, time\n"
                      "path = os.environ['VERL_FILE_LOGGER_PATH']\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', __file__])\n"
                      "def step(i):\n"
                      "    with open(path, 'a') as f:\n"
                      "        f.write(json.dumps({'step': i, 'data': {'agentrl/calc/reward': 1.0, "
                      "'agentrl/calc/success_rate': 1.0}}) + '\\n')\n"
                      "    print(f'step:{i}', flush=True)\n" + body)
    return [sys.executable, str(script)]


def test_a_stalled_rl_run_is_stopped_with_its_children_and_says_so(tmp_path, live_processes):
    # The run maps a shared-memory segment that nobody unlinks, as vLLM's processes do when they are stopped.
    leak = ("from multiprocessing import resource_tracker, shared_memory\n"
            "segment = shared_memory.SharedMemory(create=True, size=64)\n"
            "resource_tracker.unregister(segment._name, 'shared_memory')\n"
            "print('segment', segment.name, flush=True)\n")
    cmd = _fake_run(tmp_path, leak + "step(1)\ntime.sleep(600)\n")
    with pytest.raises(RLStopped, match=r"stalled: no step finished and no output for 2s .* after step 1/3"):
        run_main_ppo(cmd, tmp_path, ["calc"], steps=3, stall_s=2)
    assert live_processes(str(tmp_path)) == []
    segment = (tmp_path / "verl.log").read_text().split("segment ")[1].split()[0]
    assert segment.startswith(vllm_cpu.LEFTOVER_PREFIXES) and segment not in vllm_cpu.shm_segments()


def test_a_demo_killed_outright_takes_its_rl_run_with_it(tmp_path, live_processes):
    # SIGKILLed, the demo cannot stop the run's process group: the kernel sends the run SIGTERM as the demo dies.
    cmd = _fake_run(tmp_path, "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", "from agentrl_verl.pipeline.launch import run_main_ppo; "
                              f"run_main_ppo({cmd!r}, __import__('pathlib').Path({str(tmp_path)!r}), ['calc'], 3, "
                              "600)"])
    group = None
    try:
        run = " ".join(cmd)  # the run's command line (the owner's names the list, not this)
        while not live_processes(run) and owner.poll() is None:  # the run has started, and so has been told
            time.sleep(0.2)
        assert live_processes(run), "the run did not start"
        group = os.getpgid(int(live_processes(run)[0].split(":")[0]))
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 60  # a hang guard: it goes at once
        while live_processes(run) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert live_processes(run) == []
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        # The fake run's own child (a real run's Ray processes go with its driver, as Ray fate-shares them).
        if group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def test_a_run_that_keeps_stepping_is_not_stopped_however_long_it_takes(tmp_path, live_processes):
    # The run lasts twice the stall limit; its lines come twenty times as often as the limit (a line is a sign of
    # life, as verl's log lines are), so no load on the machine brings a gap near the limit.
    cmd = _fake_run(tmp_path, "for i in range(1, 41):\n    time.sleep(0.1)\n    print('alive', flush=True)\n"
                              "    if i % 10 == 0:\n        step(i // 10)\n")
    history = run_main_ppo(cmd, tmp_path, ["calc"], steps=4, stall_s=2)
    assert [row["step"] for row in history] == [1, 2, 3, 4]
    assert live_processes(str(tmp_path)) == []


def test_an_rl_run_in_its_thread_is_stopped_with_its_processes_and_raises_in_the_demos_thread(tmp_path, live_processes):
    cmd = _fake_run(tmp_path, "step(1)\ntime.sleep(600)\n")
    run = RLRun(cmd, tmp_path, ["calc"], RLSpec(steps=3, stall_s=600))
    run.start()
    deadline = time.monotonic() + 60  # a hang guard: the first step comes at once
    while not (tmp_path / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    run.stop()  # the demo's own error: the run goes, children included, within seconds
    assert live_processes(str(tmp_path)) == []
    with pytest.raises(RLStopped, match=r"stopped after step 1/3"):
        run.wait()
    finished = RLRun(_fake_run(tmp_path, "step(1)\n"), tmp_path, ["calc"], RLSpec(steps=1, stall_s=60))
    finished.start()
    finished.wait()  # a run that ends well raises nothing
    RLRun(cmd, tmp_path, ["calc"], RLSpec()).stop()  # never started: nothing to stop


def test_a_run_started_before_its_warm_up_waits_for_the_model(tmp_path):
    args = ("MODEL", tmp_path / "t.parquet", tmp_path / "v.parquet", "URL", tmp_path, tmp_path, RLSpec())
    assert not any("start_model_wait_s" in arg for arg in rl_command(*args))
    assert "++agentrl.start_model_wait_s=900" in rl_command(*args, start_model_wait_s=900.0)


def test_the_rl_run_gets_the_platform_of_its_device(tmp_path):
    # On the CPU, verl's CPU platform is asked for: on a host with a GPU verl would otherwise take the GPU's.
    cmd = _fake_run(tmp_path, "print('platform', os.environ.get('AGENTRL_PLATFORM'), flush=True)\nstep(1)\n")
    run_main_ppo(cmd, tmp_path, ["calc"], steps=1, stall_s=60, env=RLSpec(device="cpu").platform_env())
    assert "platform cpu" in (tmp_path / "verl.log").read_text()


def test_a_failed_rl_run_names_its_exit_code_and_the_steps_done(tmp_path):
    cmd = _fake_run(tmp_path, "step(1)\nstep(2)\nprint('Traceback: boom', flush=True)\nsys.exit(3)\n")
    with pytest.raises(RLStopped, match=r"exited with code 3 after step 2/5") as info:
        run_main_ppo(cmd, tmp_path, ["calc"], steps=5, stall_s=60)
    assert "Traceback: boom" in str(info.value)


def test_a_run_whose_ray_node_missed_its_start_up_wait_is_launched_again_once(tmp_path):
    marker = tmp_path / "launched"  # the first launch fails as Ray does under load, the second runs
    cmd = _fake_run(tmp_path, f"if not os.path.exists({str(marker)!r}):\n"
                              f"    open({str(marker)!r}, 'w').close()\n"
                              f"    print('Exception: {RAY_START_TIMEOUT}.', flush=True)\n"
                              "    sys.exit(1)\n"
                              "step(1)\nstep(2)\n")
    assert [row["step"] for row in run_main_ppo(cmd, tmp_path, ["calc"], steps=2, stall_s=60)] == [1, 2]
    again = tmp_path / "again"  # twice in a row: the error stands
    again.mkdir()
    cmd = _fake_run(again, f"print('Exception: {RAY_START_TIMEOUT}.', flush=True)\nsys.exit(1)\n")
    with pytest.raises(RLStopped, match="exited with code 1 after step 0/2"):
        run_main_ppo(cmd, again, ["calc"], steps=2, stall_s=60)


def test_the_rl_preset_trains_every_turn_against_the_policy_that_sampled_it(caplog):
    config = load_pipeline_config()
    with caplog.at_level(logging.WARNING, logger="agentrl_verl.core.config"):
        check_rl_settings(config.rl)
    assert "behaviour-policy correction" not in caplog.text
    config.rl.overrides = ["algorithm.rollout_correction.bypass_mode=false"]
    with caplog.at_level(logging.WARNING, logger="agentrl_verl.core.config"):
        check_rl_settings(config.rl)
    assert "cross-policy sampling without behaviour-policy correction" in caplog.text


def test_rl_settings_are_validated_before_the_warm_up():
    from agentrl_verl.core.config import ConfigError
    config = load_pipeline_config()
    check_rl_settings(config.rl)  # the embedded settings pass
    config.rl.overrides = ["+agentrl.cross_polcy.enable=true"]
    with pytest.raises(ConfigError, match="cross_policy"):
        check_rl_settings(config.rl)
