"""AgentRL on verl's real ``main_ppo`` (CPU): the ``agentrl_agent`` loop against a real environment stack of two
tasks, the ``task_norm_grpo`` estimator and the ``agentrl_sync`` trainer mode, with per-task metrics logged
through verl's tracking.

The stack (controller + one worker per task, subprocesses) runs ``calc`` and the ``chatter`` test task (many
turns for any model); ``make-data`` builds the datasets from the running controller.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from agentrl_verl.cli import main as agentrl_verl_cli
from agentrl_verl.models.tiny import build_tiny_model
from env_adapters.launcher import EnvStack

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_step_metrics(log: str) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` from the console logger's ``step:N - key:value - ...`` lines; numpy reprs
    such as ``np.int32(2)`` are unwrapped, non-numeric values skipped."""
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        match = re.search(r"step:(\d+) - (.*)$", line)
        if not match:
            continue
        metrics = {}
        for item in match.group(2).split(" - "):
            key, _, value = item.rpartition(":")
            value = re.sub(r"^np\.\w+\((.*)\)$", r"\1", value.strip())
            try:
                metrics[key] = float(value)
            except ValueError:
                continue
        steps[int(match.group(1))] = metrics
    return steps


# The CPU spine's runner of main_ppo with the cpu_tiny preset (its own Ray cluster); its module-level metric
# parser chokes on numpy reprs (``num_turns/min:np.int32(2)``), so this private copy of the module uses ours.
_spine = _load("test_main_ppo_cpu")
_spine.parse_step_metrics = parse_step_metrics
run_main_ppo = _spine.run_main_ppo


@pytest.fixture(scope="module")
def stack(monkeypatch_module):
    # The worker subprocesses import the chatter task from this folder.
    monkeypatch_module.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    workers = [{"task": "calc", "name": "calc", "concurrency": 8, "options": {"size": 32}},
               {"task": "chatter_task:ChatterTask", "name": "chatter", "concurrency": 8,
                "options": {"rounds": 3, "size": 8}}]
    with EnvStack({"controller": {"port": 0}, "workers": workers}) as env:
        yield env


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_two_tasks_train_with_task_normalised_advantages(stack, tmp_path):
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
