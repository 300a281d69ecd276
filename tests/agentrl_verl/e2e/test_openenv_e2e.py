"""``agentrl_agent`` trains on OpenEnv environments through verl's real ``main_ppo`` (CPU): the echo environment that
OpenEnv's CLI scaffolds (not ours, ``echo_env_url``), calc reached through this project's OpenEnv server (the
``openenv`` family with its MCP tools), and calc natively, in one ``agentrl_async`` run with task-normalised GRPO;
each task has its own metrics. (Cross-policy sampling acts on turns, whatever serves the episode: its own runs are in
``test_cross_policy_e2e.py``.)"""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.tools.data import make_row
from env_adapters.launcher import EnvStack

pytestmark = pytest.mark.slow

STEPS = 3
TASKS = ("echo", "calc_openenv", "calc")
CALC = {"seed": 0, "size": 32}
STARTUP_TIMEOUT_S = 180  # openenv imports gradio and fastmcp: 10-45 s on the 2-core machine


# Two OpenEnv servers and a stack start before the run (openenv's imports: 10-45 s each here), then the run's own
# hang guard (conftest's RUN_TIMEOUT_S); beside the rest of the suite the whole took 496 s.
@pytest.mark.timeout(1200)
def test_one_run_trains_on_openenv_environments_beside_a_native_family(echo_env_url, start_stack, tmp_path,
                                                                        run_main_ppo):
    served = {"controller": {"port": 0}, "openenv": {"port": 0},
              "workers": [{"task": "calc", "concurrency": 8, "options": CALC}]}
    with EnvStack(served, startup_timeout=STARTUP_TIMEOUT_S) as server:
        workers = [
            {"task": "openenv", "name": "echo", "concurrency": 8,
             "options": {"url": echo_env_url, "size": 16, "max_rounds": 1, "end_at_limit": True,
                         "prompt": "Send a message with the step tool."}},
            {"task": "openenv", "name": "calc_openenv", "concurrency": 8,
             "options": {"url": server.openenv_url, "size": 16, "interface": "mcp", "max_rounds": 3,
                         "reset_kwargs": {"task": "calc"}}},
            {"task": "calc", "name": "calc", "concurrency": 8, "options": CALC},
        ]
        with start_stack(workers) as stack:
            # The tasks take turns in the data, which verl reads in order: every few groups hold all three.
            rows = [make_row(task, index, "train") for index, task in itertools.product(range(16), TASKS)]
            pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet", index=False)
            pd.DataFrame(rows[:6]).to_parquet(tmp_path / "val.parquet", index=False)
            _, steps = run_main_ppo(
                tmp_path, build_tiny_model(), "openenv",
                f"trainer.total_training_steps={STEPS}",
                "data.shuffle=false",
                "algorithm.adv_estimator=task_norm_grpo",
                "trainer.v1.trainer_mode=agentrl_async",
                f"+agentrl.env.url={stack.url}",
                "+agentrl.agent.max_turns=3",
                "+agentrl.agent.max_new_tokens=16",
                "+agentrl.agent.max_total_tokens=600",
                "data.max_prompt_length=400",
                "data.max_response_length=200",
            )
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert all(m["actor/pg_loss"] == m["actor/pg_loss"] for m in steps.values())  # trained, not NaN
    for task in TASKS:
        played = sum(m.get(f"agentrl/{task}/episodes", 0) for m in steps.values())
        assert played > 0, (task, [sorted(k for k in m if k.startswith("agentrl/")) for m in steps.values()])
        assert all(m.get(f"agentrl/{task}/status/task_error", 0) == 0 for m in steps.values()), task
