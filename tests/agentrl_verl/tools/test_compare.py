"""The paired comparison of held-out success before and after RL (``agentrl_verl.tools.compare``)."""

import json
from pathlib import Path

import pytest

from agentrl_verl.tools.compare import paired_changes, sign_test_p


def write_trajectories(out: Path, outcomes: dict[tuple[str, str], tuple[list[bool], list[bool]]]) -> Path:
    """A demo run's ``trajectories.jsonl`` in ``out``: per (task, mode), the successes before and after RL by index."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "trajectories.jsonl", "w") as f:
        for phase, side in (("before_rl", 0), ("after_rl", 1)):
            for (task, mode), sides in outcomes.items():
                for index, success in enumerate(sides[side]):
                    f.write(json.dumps({"phase": phase, "eval": mode, "task": task, "index": index,
                                        "status": "completed", "reward": float(success), "success": success}) + "\n")
    return out


def test_the_paired_sign_test():
    assert sign_test_p(0, 0) == 1.0 and sign_test_p(5, 5) > 0.5
    assert sign_test_p(10, 0) == pytest.approx(1 / 1024) and sign_test_p(30, 15) < 0.05 < sign_test_p(20, 15)


def test_pairs_are_the_same_index_before_and_after_rl_per_task_and_mode(tmp_path):
    t, f = True, False
    run = write_trajectories(tmp_path / "a", {("calc", "greedy"): ([f, f, t, t, f], [t, t, f, t, f]),
                                              ("calc", "sampled"): ([t, f], [t, f]),
                                              ("kg", "greedy"): ([t, t, t], [f, f, t])})
    assert paired_changes(run) == {("calc", "greedy"): (2, 1), ("calc", "sampled"): (0, 0), ("kg", "greedy"): (0, 2)}


def test_an_index_evaluated_only_before_rl_makes_no_pair(tmp_path):
    run = write_trajectories(tmp_path, {("calc", "greedy"): ([False, False, False], [True])})
    assert paired_changes(run) == {("calc", "greedy"): (1, 0)}
