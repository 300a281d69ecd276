"""A tiny arithmetic task for CPU end-to-end runs: a verl parquet dataset and its rule reward.

Loaded by path (``custom_reward_function.path``) inside verl's reward workers, so it imports nothing from tests.
"""

from __future__ import annotations

import random
from pathlib import Path

DATA_SOURCE = "arith"


def make_parquet(path: str | Path, num_rows: int, seed: int = 0) -> Path:
    """Write ``num_rows`` two-digit addition prompts in verl's RL dataset layout."""
    import pandas as pd

    rng = random.Random(seed)
    rows = []
    for index in range(num_rows):
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"What is {a} plus {b}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": index},
        })
    path = Path(path)
    pd.DataFrame(rows).to_parquet(path)
    return path


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1 for the right answer anywhere in the response, else a small penalty per response character.

    The length penalty (the answer is short) keeps rewards varied within a group even for a random model, so
    GRPO advantages are non-zero and the actor really changes.
    """
    if ground_truth in solution_str:
        return 1.0
    return -len(solution_str) / 1000
