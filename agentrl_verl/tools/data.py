"""``agentrl-verl make-data``: verl parquet datasets (train/val) for the ``agentrl_agent`` loop.

The environment owns the prompts, so a dataset row only names a sample: its task and its index. The tasks
and their indices come from a running controller (``--controller URL``: ``list_workers`` and
``get_indices``) or from an environment stack config (``--config STACK.yaml``: each worker's task family
is instantiated to list its indices, nothing is started).

Each task's indices are shuffled (fixed ``--seed``) and split into validation and training indices. The
training set has ``--train-size`` rows (default: all training indices), shared among tasks in
proportion to their weights (``--task NAME=WEIGHT``, default 1 each, i.e. balanced); a task with fewer
indices than its share is replicated (each pass over its indices reshuffled), so small tasks are not
drowned by large ones. The validation set holds every validation index once.

Row schema (what verl's ``RLHFDataset`` and ``agentrl_agent`` read)::

    data_source   task name as the controller knows it (the task of the sample; per-task metrics and
                  task advantage normalisation group by it)
    agent_name    "agentrl_agent"
    prompt        [{"role": "user", "content": "<task> #<index>"}]  placeholder; the real prompt comes
                  from the environment's start_sample
    ability       "agent"
    reward_model  {"style": "env", "ground_truth": ""}  (the reward comes from the environment)
    extra_info    {"index": <sample index>, "task": <task>, "split": "train" | "val"}
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl_verl.core.config import AGENT_NAME
from env_adapters.http import read_token_file
from env_adapters.protocol import Index

logger = logging.getLogger(__name__)



def split_indices(indices: list[Index], val_fraction: float, rng: random.Random) -> tuple[list[Index], list[Index]]:
    """Shuffle ``indices`` and split off ``val_fraction`` of them (at least one when there are two or more)."""
    shuffled = list(indices)
    rng.shuffle(shuffled)
    n_val = math.ceil(len(shuffled) * val_fraction) if val_fraction > 0 and len(shuffled) > 1 else 0
    n_val = min(n_val, len(shuffled) - 1) if shuffled else 0
    return shuffled[n_val:], shuffled[:n_val]


def allocate(sizes: Mapping[str, int], weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Rows per task: ``total`` shared in proportion to ``weights`` (largest remainder; tasks with a positive
    weight and any index get at least one row)."""
    active = {t: w for t, w in weights.items() if w > 0 and sizes.get(t, 0) > 0}
    if not active:
        raise ValueError("no task has both a positive weight and a training index")
    scale = sum(active.values())
    exact = {t: total * w / scale for t, w in active.items()}
    counts = {t: max(1, math.floor(x)) for t, x in exact.items()}
    for t in sorted(active, key=lambda t: exact[t] - math.floor(exact[t]), reverse=True):
        if sum(counts.values()) >= total:
            break
        counts[t] += 1
    return counts


def replicate(indices: list[Index], count: int, rng: random.Random) -> list[Index]:
    """``count`` indices drawn as passes over ``indices``, each pass reshuffled (no index twice per pass)."""
    out: list[Index] = []
    while len(out) < count:
        pass_ = list(indices)
        rng.shuffle(pass_)
        out.extend(pass_[: count - len(out)])
    return out


def make_row(task: str, index: Index, split: str, agent_name: str = AGENT_NAME) -> dict[str, Any]:
    """One dataset row naming sample ``index`` of ``task`` (see the module docstring)."""
    return {
        "data_source": task,
        "agent_name": agent_name,
        "prompt": [{"role": "user", "content": f"{task} #{index}"}],
        "ability": "agent",
        "reward_model": {"style": "env", "ground_truth": ""},
        "extra_info": {"index": index, "task": task, "split": split},
    }


def build_datasets(
    task_indices: Mapping[str, list[Index]],
    weights: Mapping[str, float] | None = None,
    train_size: int | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    agent_name: str = AGENT_NAME,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Build the train and val rows (see the module docstring).

    Args:
        task_indices: Each task's sample indices.
        weights: Sampling weight per task (missing tasks: 1.0; 0 leaves a task out of training).
        train_size: Training rows; default the number of training indices of all tasks.
        val_fraction: Share of each task's indices held out for validation.
        seed: Seed of every shuffle.
        agent_name: Value of the ``agent_name`` column.

    Returns:
        ``(train_rows, val_rows)``, each shuffled.
    """
    unknown = sorted(set(weights or {}) - set(task_indices))
    if unknown:
        raise ValueError(f"weights given for unknown task(s) {unknown}; tasks: {sorted(task_indices)}")
    kinds = {type(i) for indices in task_indices.values() for i in indices}
    if len(kinds) > 1:
        raise ValueError(f"tasks mix index types {sorted(k.__name__ for k in kinds)}; parquet needs one type")
    rng = random.Random(seed)
    splits = {task: split_indices(indices, val_fraction, rng) for task, indices in sorted(task_indices.items())}
    train_pool = {task: train for task, (train, _) in splits.items()}
    weights = {task: float((weights or {}).get(task, 1.0)) for task in task_indices}
    total = train_size if train_size is not None else sum(map(len, train_pool.values()))
    counts = allocate({t: len(v) for t, v in train_pool.items()}, weights, total)
    train = [make_row(t, i, "train", agent_name) for t, n in sorted(counts.items())
             for i in replicate(train_pool[t], n, rng)]
    val = [make_row(t, i, "val", agent_name) for t, (_, held_out) in splits.items() for i in held_out]
    rng.shuffle(train)
    rng.shuffle(val)
    for task, n in sorted(counts.items()):
        logger.info("task %s: %d indices, %d train rows (weight %g), %d val rows", task,
                    len(task_indices[task]), n, weights[task], len(splits[task][1]))
    return train, val


# ---- sources of tasks and indices ------------------------------------------------------------------


async def indices_from_controller(url: str, names: list[str] | None, token: str | None = None) -> dict[str, list]:
    """Tasks and indices offered by a running controller (all registered tasks unless ``names``)."""
    from env_adapters.client import EnvClient

    async with EnvClient(url, token=token) as client:
        if not names:
            workers = await client.list_workers()
            names = sorted(workers)
        return {name: list(await client.get_indices(name)) for name in names}


def indices_from_config(path: str | Path, names: list[str] | None) -> dict[str, list]:
    """Tasks and indices of an environment stack config, by instantiating each worker's task (no start)."""
    from env_adapters.launcher import load_config
    from env_adapters.task import get_task_class

    found: dict[str, list] = {}
    for spec in load_config(path).workers:
        name = spec.name or spec.task
        if (names and name not in names) or name in found:
            continue
        found[name] = list(get_task_class(spec.task)(**spec.options).indices())
    missing = sorted(set(names or []) - set(found))
    if missing:
        raise ValueError(f"task(s) {missing} not in {path}; it has {sorted(found)}")
    return found


# ---- command line ----------------------------------------------------------------------------------


def _parse_task(text: str) -> tuple[str, float]:
    name, _, weight = text.partition("=")
    try:
        return name, float(weight) if weight else 1.0
    except ValueError:
        raise argparse.ArgumentTypeError(f"--task {text!r}: the weight after '=' must be a number") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--controller", metavar="URL", help="running controller to ask for tasks and indices")
    source.add_argument("--config", metavar="YAML", help="environment stack config (agentrl-env up) to read")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token", default=None, help="controller token (with --controller)")
    token.add_argument("--token-file", default=None, help="file holding the controller token (with --controller)")
    parser.add_argument("--task", dest="tasks", action="append", type=_parse_task, default=[],
                        metavar="NAME[=WEIGHT]", help="task to include, with its sampling weight (default: all, 1)")
    parser.add_argument("--out", required=True, help="output folder for train.parquet and val.parquet")
    parser.add_argument("--train-size", type=int, default=None, help="training rows (default: all train indices)")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="share of each task held out (0.1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agent-name", default=AGENT_NAME, help="agent_name column (default agentrl_agent)")


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    names = [name for name, _ in args.tasks] or None
    if args.controller:
        token = read_token_file(args.token_file) if args.token_file else args.token
        task_indices = asyncio.run(indices_from_controller(args.controller, names, token))
    else:
        task_indices = indices_from_config(args.config, names)
    train, val = build_datasets(task_indices, dict(args.tasks), args.train_size, args.val_fraction, args.seed,
                                args.agent_name)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("val", val)):
        if rows:
            pd.DataFrame(rows).to_parquet(out / f"{split}.parquet", index=False)
        logger.info("wrote %d %s rows to %s", len(rows), split, out / f"{split}.parquet")
    return 0
