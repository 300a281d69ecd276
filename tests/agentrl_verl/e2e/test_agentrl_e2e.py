"""AgentRL on verl's real ``main_ppo`` (CPU): the ``agentrl_agent`` loop against a real environment stack of two
tasks, the ``task_norm_grpo`` estimator and the ``agentrl_sync`` trainer mode, with per-task metrics logged
through verl's tracking.

The run starts its own stack on its Ray cluster (``agentrl.env.launch=ray``: controller and one worker per task as
Ray actors) of ``calc`` and the ``chatter`` test task (many turns for any model), and takes it down at the end. The
datasets come from ``make-data`` on a stack of the same workers started here (the other e2e tests give the run such
a stack's URL).
"""

from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from agentrl_verl.harness.tiny_model import build_tiny_model
from agentrl_verl.tools.cli import main as agentrl_verl_cli

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


WORKERS = [{"task": "calc", "name": "calc", "concurrency": 8, "options": {"size": 32}},
           {"task": "chatter_task:ChatterTask", "name": "chatter", "concurrency": 8,
            "options": {"rounds": 3, "size": 8}}]


def test_two_tasks_train_with_task_normalised_advantages_on_a_stack_the_run_starts(start_stack, tmp_path,
                                                                                    run_main_ppo):
    with start_stack(WORKERS) as env:
        assert agentrl_verl_cli(["make-data", "--controller", env.url, "--out", str(tmp_path), "--train-size", "16",
                                 "--val-fraction", "0.25", "--seed", "0"]) == 0
    assert set(pd.read_parquet(tmp_path / "train.parquet")["data_source"]) == {"calc", "chatter"}
    stack_file = tmp_path / "stack.yaml"
    stack_file.write_text(yaml.safe_dump({"controller": {"port": 0}, "workers": WORKERS}))

    log, steps = run_main_ppo(
        tmp_path, build_tiny_model(), "agentrl",
        "trainer.total_training_steps=3",
        "algorithm.adv_estimator=task_norm_grpo",
        "trainer.v1.trainer_mode=agentrl_sync",
        "+agentrl.env.launch=ray",
        f"+agentrl.env.stack={stack_file}",
        "+agentrl.task_adv_norm=token",
        "+agentrl.agent.max_turns=3",
        "+agentrl.agent.max_new_tokens=24",
        "+agentrl.agent.max_total_tokens=400",
        "data.max_prompt_length=160",
        "data.max_response_length=160",
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))},  # chatter_task
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
    url = re.search(r"environment stack of \S+ up at (http://[\d.]+:\d+) for this run \(2 workers\)", log).group(1)
    with pytest.raises(OSError):  # the run's controller went with the run
        urllib.request.urlopen(f"{url}/api/list_workers", timeout=5)
    # The run's own stack processes (its workers name its controller's port): others' may run beside this test.
    port = f":{url.rsplit(':', 1)[1]}"
    stack_processes = [p for p in psutil.process_iter(["cmdline"])
                       if "env_adapters.cli" in (cmdline := p.info["cmdline"] or []) and port in " ".join(cmdline)]
    assert stack_processes == []

