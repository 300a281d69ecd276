"""Paired comparison of held-out success before and after RL, from the demo's ``trajectories.jsonl``.

The demo evaluates the same held-out indices before and after RL. Pairing each index with itself removes the spread
between problems; what remains is each episode's own noise, which the exact sign test over the pairs that changed
(McNemar's test) accounts for. Pairs pool over runs (seeds), each index paired within its own run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

PHASES = ("before_rl", "after_rl")
"""The ``phase`` of an episode in ``trajectories.jsonl``."""


def paired_changes(out: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (task, evaluation mode) of one demo run in ``out``: its (fail -> success, success -> fail) pairs, an index
    evaluated before and after RL being one pair (indices evaluated only once are left out)."""
    outcome: dict[tuple[str, str, str, object], bool] = {}
    with open(out / "trajectories.jsonl") as f:
        for line in f:
            row = json.loads(line)
            outcome[row["task"], row["eval"], row["phase"], row["index"]] = bool(row["success"])
    changes: dict[tuple[str, str], tuple[int, int]] = {}
    for (task, mode, phase, index), before in outcome.items():
        if phase != PHASES[0]:
            continue
        up, down = changes.get((task, mode), (0, 0))
        after = outcome.get((task, mode, PHASES[1], index))
        if after is not None:
            up, down = up + (after and not before), down + (before and not after)
        changes[task, mode] = (up, down)
    return changes


def sign_test_p(up: int, down: int) -> float:
    """One-sided exact p-value of ``up`` or more of ``up + down`` changed pairs going up, if up and down were even."""
    n = up + down
    return sum(math.comb(n, k) for k in range(up, n + 1)) / 2**n if n else 1.0
