"""``agentrl-verl demo``: its settings and report (fast), and the real thing end to end (slow)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentrl_verl.harness.demo import DemoProgress, headline, stop_reason, summary_table, write_summary
from agentrl_verl.pipeline.cold_start import WarmupResult
from agentrl_verl.pipeline.evaluation import held_out_changes
from agentrl_verl.pipeline.launch import RLStopped
from agentrl_verl.pipeline.settings import RLSpec, load_pipeline_config
from agentrl_verl.presets import CONFIG_DIR
from agentrl_verl.tools.evaluate import EvalResult
from env_adapters.sandbox.containers import docker_available

DEMO_RUN = Path(CONFIG_DIR) / "demo_run.yaml"
MULTITASK = Path(CONFIG_DIR) / "demo_multitask.yaml"


def _result(task: str, successes: list[bool]) -> EvalResult:
    return EvalResult(task, "greedy", [{"task": task, "index": i, "status": "completed" if ok else "task limit reached",
                                        "reward": float(ok), "success": ok, "turns": 2, "text": ""}
                                       for i, ok in enumerate(successes)])


def test_summary_compares_before_and_after_per_task():
    before = {"greedy": {"calc": _result("calc", [True, False, False, False]), "db": _result("db", [False, False])}}
    after = {"greedy": {"calc": _result("calc", [True, True, True, False]), "db": _result("db", [False, False])}}
    tasks = held_out_changes(before, after, learnable=["calc"])
    assert tasks["calc"]["greedy"]["success_before"] == 0.25 and tasks["calc"]["greedy"]["success_after"] == 0.75
    assert tasks["calc"]["greedy"]["success_change"] == 0.5 and tasks["calc"]["held_out"] == 4
    table = summary_table(tasks)
    assert tasks["calc"]["greedy"]["se_before"] == pytest.approx((0.25 * 0.75 / 4) ** 0.5)
    assert "| calc | greedy | 4 | 0.250 ± 0.217 | 0.750 ± 0.217 | +0.500 |" in table
    assert "db: a real AgentBench task family" in table  # says why the real tasks stay near zero
    summary = {"tasks": tasks, "timings_s": {"total_s": 412.3}}
    assert headline(summary) == "calc_greedy_before=0.250 calc_greedy_after=0.750 db_greedy_before=0.000 " \
                                "db_greedy_after=0.000 total_s=412"
    before_only = held_out_changes(before, None, learnable=["calc"])
    assert "success_after" not in before_only["calc"]["greedy"]
    assert "| calc | greedy | 4 | 0.250 ± 0.217 | - | - |" in summary_table(before_only)
    # The base model's zero-shot success gets a column of its own; a real model gets no tiny-model note.
    zero_shot = held_out_changes(before, after, learnable=["calc"], base={"greedy": {
        "calc": _result("calc", [False] * 4), "db": _result("db", [False, False])}})
    table = summary_table(zero_shot, tiny=False)
    assert "| task | eval | held-out | zero-shot | success before RL |" in table
    assert "| calc | greedy | 4 | 0.000 ± 0.000 | 0.250 ± 0.217 | 0.750 ± 0.217 | +0.500 |" in table
    assert "1.6M" not in table


def test_stop_reasons_name_what_ended_the_demo():
    assert stop_reason(KeyboardInterrupt()) == "interrupted (Ctrl-C)"
    assert stop_reason(KeyboardInterrupt("signal 15")) == "interrupted (signal 15)"
    assert stop_reason(RLStopped("the RL run (main_ppo) exited with code 1 after step 2/40; end of verl.log:\nx")) == (
        "the RL run (main_ppo) exited with code 1 after step 2/40")
    assert stop_reason(ValueError("bad")) == "error: ValueError: bad"


def test_an_early_end_still_writes_the_summary_of_what_was_measured(tmp_path):
    config = load_pipeline_config(None, ["rl.steps=40"])
    progress = DemoProgress(tmp_path, config, tasks=["calc"], learnable=["calc"], demonstrations=64,
                            warm=WarmupResult(str(tmp_path / "w"), 120, 0.61, "cpu", [{"step": 120, "success": 0.61}]),
                            before={"greedy": {"calc": _result("calc", [True, False])}})
    progress.timings = {"build_model_s": 1.0, "warmup_s": 200.0, "eval_before_s": 30.0}
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "data": {"agentrl/calc/success_rate": 0.5}}) + "\n" for i in (1, 2, 3)))
    summary = write_summary(progress, "the RL run stalled: no step finished and no output for 900s (rl.stall_s)")
    assert summary["status"] == "stopped" and "stalled" in summary["stopped_because"]
    assert summary["rl"]["steps_done"] == 3 and summary["warmup"]["held_out_success"] == 0.61
    assert summary["tasks"]["calc"]["greedy"]["success_before"] == 0.5
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "stopped"
    text = (tmp_path / "summary.md").read_text()
    assert "**Stopped early**: the RL run stalled" in text and "RL steps done: 3/40" in text
    assert "Phases done: build_model, warmup, eval_before" in text
    assert "| calc | greedy | 2 | 0.500 ± 0.354 | - | - |" in text
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "learning_curve.png").stat().st_size > 0


def test_a_reused_warm_up_is_reported_with_where_it_came_from_and_its_history(tmp_path):
    config = load_pipeline_config(None, ["warmup.reuse=true"])
    cached = tmp_path / "cache" / "warmup-0123456789abcdef"
    progress = DemoProgress(tmp_path, config, tasks=["calc"], learnable=["calc"], demonstrations=64,
                            warm=WarmupResult(str(cached), 120, 0.61, "cpu", [{"step": 120, "success": 0.61}]),
                            warmup_cache={"dir": str(cached), "reused": True},
                            before={"greedy": {"calc": _result("calc", [True, False])}})
    progress.timings = {"build_model_s": 1.0, "warmup_s": 0.2}
    warmup = write_summary(progress, "interrupted (Ctrl-C)")["warmup"]
    assert warmup["cache"] == {"dir": str(cached), "reused": True}
    assert (warmup["steps"], warmup["held_out_success"], warmup["demonstrations"]) == (120, 0.61, 64)
    assert warmup["history"] == [{"step": 120, "success": 0.61}]
    text = (tmp_path / "summary.md").read_text()
    assert f"Warm-up **reused** from `{cached}`" in text and "120 steps on 64 demonstrations" in text
    assert "`warmup_s` here is only the lookup" in text
    progress.warmup_cache["reused"] = False
    write_summary(progress, "interrupted (Ctrl-C)")
    assert f"Warm-up trained by this run and cached in `{cached}`" in (tmp_path / "summary.md").read_text()
    progress.warmup_cache = None  # warmup.reuse off: nothing to say
    write_summary(progress, "interrupted (Ctrl-C)")
    assert "Warm-up" not in (tmp_path / "summary.md").read_text()


# ---- end to end -------------------------------------------------------------------------------------------


def _settings_without_os(tmp_path: Path) -> Path:
    """The default settings minus the Docker task (the demo's Docker path is covered by the full run)."""
    settings = yaml.safe_load(DEMO_RUN.read_text())
    settings["tasks"] = [t for t in settings["tasks"] if not t.get("needs_docker")]
    path = tmp_path / "demo_run.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


DEMO_HANG_GUARD_S = 4 * 3600
"""Only a guard against a hung test: the demo itself stops a stalled RL run (``rl.stall_s``) and has no time limit."""


def _run_demo(out: Path, *args: str) -> str:
    """Run ``agentrl-verl demo`` into ``out``; returns its log (stderr)."""
    cmd = [sys.executable, "-m", "agentrl_verl.tools.cli", "demo", "--output-dir", str(out), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=DEMO_HANG_GUARD_S)
    assert res.returncode == 0, res.stderr[-5000:]
    return res.stderr


PLUMBING_RL_STEPS = 3
"""RL steps of the suite's default-demo run: the embedded settings at plumbing size. Whether RL raises held-out
success is measured by the full default run over seeds (``python -m bench.demo_seeds --config
agentrl_verl/presets/demo_run.yaml --seeds 0 1``, docs/demo.md), which takes longer than the suite may:
at 40 RL steps one run took 999-1371 s of the suite's time, and 20 steps is not enough evidence for one run."""


@pytest.mark.slow
@pytest.mark.timeout(DEMO_HANG_GUARD_S)
def test_demo_runs_end_to_end_and_reports(tmp_path, live_processes):
    """The embedded default settings (every task, Docker's too where a daemon answers; the asynchronous trainer with
    cross-policy sampling), shrunk to plumbing size: a short warm-up, 16 held-out calc indices, greedy only, 3 RL steps
    of 8 groups of 2 (the preset's groups of 8 made each update take 44-50 s beside the suite's other runs). verl's run
    starts before the warm-up, as on a GPU, its trainer waiting for the warmed-up model (the other end-to-end demos
    start it after, as on a CPU)."""
    out = tmp_path / "demo"
    log = _run_demo(out, "--set", "warmup.max_steps=10", "--set", "warmup.eval_every=10", "--set",
                    "eval.warmup_indices=16", "--set", "eval.sampled=false", "--set", "demonstrations=64", "--set",
                    "tasks.0.held_out=16", "--set", f"rl.steps={PLUMBING_RL_STEPS}", "--set",
                    "rl.start_with_warmup=true", "--rl-override", "actor_rollout_ref.rollout.n=2")
    assert log.index(": RL: ") < log.index("warm-up: 10 steps") < log.index("RL step 1/")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["stopped_because"] is None
    assert summary["warmup"]["steps"] == 10 and summary["warmup"]["demonstrations"] == 64
    trained = {"calc", "db", "os"} if docker_available() else {"calc", "db"}
    tasks = trained | {"kg", "webshop"}  # weight 0: evaluated before and after RL, not trained on
    assert set(summary["tasks"]) == tasks and summary["tasks"]["calc"]["held_out"] == 16
    # Progress was shown per RL step, with the reward and success of each trained task.
    steps = list(range(1, PLUMBING_RL_STEPS + 1))
    assert [int(m) for m in re.findall(rf"RL step (\d+)/{PLUMBING_RL_STEPS}", log)] == steps
    assert all(f"{task}: reward" in log for task in trained)
    assert not any(f"{task}: reward" in log for task in tasks - trained)
    assert [row["step"] for row in summary["rl"]["history"]] == steps
    history = [row["data"] for row in summary["rl"]["history"]]
    # The asynchronous trainer with cross-policy sampling: the pool's stale turns are off-policy by design and
    # outside the bound, yet no turn of the trained policy was beyond it and no group was trained beyond it.
    assert all(m["async/staleness/turn_lag/over"] == 0 for m in history)
    assert history[-1]["async/total/stale_kept"] == 0 and history[-1]["async/total/dropped"] == 0
    assert all(0 < m["cross_policy/turn_share/stale"] < 1 for m in history)
    for name in ("summary.md", "learning_curve.png", "trajectories.jsonl"):
        assert (out / name).stat().st_size > 0
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert {(r["phase"], r["task"]) for r in rows} == {(p, t) for p in ("before_rl", "after_rl") for t in tasks}
    assert live_processes(str(out)) == []  # environment processes, verl and its Ray cluster are gone


@pytest.mark.slow
@pytest.mark.timeout(DEMO_HANG_GUARD_S)
def test_the_multitask_demo_runs_end_to_end_and_reports_every_family(tmp_path, live_processes):
    """The multi-task settings, shrunk to plumbing size (a few demonstrations, 10 warm-up steps, 4 held-out indices per
    family, greedy only, 2 RL steps of 8 groups of 2): every family's worker, demonstrations, warm-up, evaluation and RL
    episodes at the preset's lengths run through to the summary. Whether RL raises success is measured by the full run
    (README, "Several families"), which takes too long for the suite. Expected runtime: 224 s on the 2-core machine
    alone (most of it Ray's and verl's start-up); beside the suite's other runs, with the preset's groups of 6, it took
    512-593 s."""
    out = tmp_path / "demo"
    small = [f"tasks.{i}.{key}={value}" for i in range(4) for key, value in (("demonstrations", 16), ("held_out", 4))]
    log = _run_demo(out, "--config", str(MULTITASK), "--set", "warmup.max_steps=10", "--set", "warmup.eval_every=10",
                    "--set", "eval.warmup_indices=4", "--set", "eval.sampled=false", "--set", "rl.steps=2",
                    *(arg for setting in small for arg in ("--set", setting)),
                    # Groups of 2 rather than the preset's 6: the update of 48 long episodes took 33-82 s a step here.
                    "--rl-override", "actor_rollout_ref.rollout.n=2",
                    "--rl-override", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    summary = json.loads((out / "summary.json").read_text())
    families = ["calc", "kg", "webshop", "alfworld"]
    assert summary["status"] == "finished" and list(summary["tasks"]) == families
    assert all(row["held_out"] == 4 and "success_after" in row["greedy"] for row in summary["tasks"].values())
    assert summary["warmup"]["demonstrations"] == 4 * 16 and summary["warmup"]["steps"] == 10
    assert [int(m) for m in re.findall(r"RL step (\d+)/2", log)] == [1, 2]
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert {(r["phase"], r["task"]) for r in rows} == {(p, t) for p in ("before_rl", "after_rl") for t in families}
    assert live_processes(str(out)) == []


def _task_runner_up(demo: subprocess.Popen) -> bool:
    """Whether the demo's RL run has verl's task runner (the ``TaskRunner`` actor) running: the run's Ray cluster is
    up and verl is building its trainer. (Its log lines reach verl.log through Ray's log monitor, seconds late.)"""
    import psutil

    for child in psutil.Process(demo.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if (child.cmdline() or [""])[0].startswith("ray::TaskRunner"):
                return True
    return False


@pytest.mark.slow
@pytest.mark.timeout(DEMO_HANG_GUARD_S)
def test_ctrl_c_during_rl_stops_everything(tmp_path, live_processes):
    # Interrupted once verl's task runner is up (its workers, rollout servers and agent loop still starting): the same
    # teardown as during a step (the run's process group, its Ray cluster, the demo's stack), at a third of the cost.
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "agentrl_verl.tools.cli", "demo", "--output-dir", str(out),
           "--config", str(_settings_without_os(tmp_path)), "--set", "warmup.max_steps=5", "--set",
           "eval.sampled=false", "--set", "demonstrations=64", "--set", "tasks.0.held_out=16", "--set",
           "eval.warmup_indices=16"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url, launched = None, False
    try:
        for line in proc.stderr:  # however long a loaded machine takes to get there
            match = re.search(r"environment stack at (http://[\d.]+:\d+)", line)
            url = match.group(1) if match else url
            launched = launched or ": RL: " in line
            if "held-out greedy success:" in line:  # the evaluation before RL (beside verl's start-up) is done
                break
        while proc.poll() is None and not _task_runner_up(proc):
            time.sleep(0.5)
        assert url is not None and launched and proc.poll() is None, "the demo did not reach RL"
    finally:
        # Also when the test fails or times out: a demo killed outright could not stop its RL run and stack.
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode != 0
    time.sleep(2)  # SIGKILLed helpers may take a moment to be reaped by init
    assert live_processes(str(out), url) == []
    summary = json.loads((out / "summary.json").read_text())  # what was measured, and why it stopped
    assert summary["status"] == "stopped" and summary["stopped_because"] == "interrupted (Ctrl-C)"
    assert summary["warmup"]["steps"] == 5 and "greedy" in summary["tasks"]["calc"]


@pytest.mark.parametrize(("device", "relaunched"), [("cpu", True), ("cuda", False)])
def test_the_demo_takes_the_shared_cpu_thread_settings_only_where_its_rl_runs_on_the_cpu(monkeypatch, tmp_path,
                                                                                        device, relaunched):
    import argparse
    import signal as signals

    from agentrl_verl.harness import demo

    calls = []
    monkeypatch.setattr(demo, "relaunch_with_demo_threads", lambda: calls.append("relaunch"))
    monkeypatch.setattr(RLSpec, "resolved_device", lambda self: device)
    monkeypatch.setattr(demo, "check_rl_settings", lambda spec: None)
    monkeypatch.setattr(demo, "run_demo", lambda out, config: {"tasks": {}, "timings_s": {"total_s": 1.0}})
    monkeypatch.setattr(signals, "signal", lambda *args: None)  # the test process keeps its handlers
    args = argparse.Namespace(config=None, model="tiny", overrides=[], rl_overrides=[], engine=None,
                              output_dir=str(tmp_path))
    assert demo.run(args) == 0
    assert calls == (["relaunch"] if relaunched else [])
