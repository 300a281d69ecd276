"""The single-GPU recipe's smoke run, summarised: per-step times, generated tokens/s, weight updates, GPU memory.

    bash bench/device_recipe_1gpu.sh      # on a GPU machine: recipes/agentrl/run.sh 1gpu, 3 steps
    python -m bench.gpu_recipe DIR        # the table of DIR/metrics.jsonl, DIR/gpu.csv and DIR/run.log

The smoke's environment stack is the recipe's own YAML at smoke size (:func:`smoke_stack`): all five families where
a Docker daemon answers and MariaDB is installed, else without ``os`` and with ``db`` on SQLite.

Results and how to read them: ``docs/results/gpu-recipe.md``.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from env_adapters.sandbox.containers import docker_available
from env_adapters.sandbox.mariadb import mariadb_available

COLUMNS = {
    "timing_s/step": "step s",
    "timing_s/gen": "gen s",
    "timing_s/update_actor": "update_actor s",
    "timing_s/update_weights": "weight update s",
    "timing_s/update_stale_weights": "stale refresh s",
    "actor/perf/max_memory_allocated_gb": "actor peak GiB",
}
RECIPE_STACK = Path(__file__).resolve().parents[1] / "recipes" / "agentrl" / "env" / "agentbench_fc.yaml"
SERVER_DEVICE = re.compile(r"hf rollout server (\S+): \S+ on (\S+) \((\S+)\)")


def smoke_stack(recipe: dict[str, Any], token_file: str, *, docker: bool,
                mysql: bool) -> tuple[dict[str, Any], list[str]]:
    """The recipe's environment stack at smoke size, served on the training host.

    The controller on loopback with the token in ``token_file`` (the recipe's path: ``run.sh`` hands the file to the
    training side), one replica a family, the recipe's options otherwise.

    Args:
        recipe: The recipe's stack (``recipes/agentrl/env/agentbench_fc.yaml``); not modified.
        token_file: Where ``agentrl-env up`` writes the controller's token.
        docker: Whether a Docker daemon answers: without one ``os`` is left out.
        mysql: Whether a MariaDB server can be started: without one ``db`` runs on SQLite (its own item set).

    Returns:
        The stack, and one line per family left out or changed, saying why.
    """
    stack = copy.deepcopy(recipe)
    stack["controller"] = {"host": "127.0.0.1", "port": 5020, "token_file": token_file}
    workers, notes = [], []
    for worker in stack["workers"]:
        if worker["task"] == "os" and not docker:
            notes.append(f"{worker['name']}: left out, no Docker daemon answers")
            continue
        if worker["task"] == "db" and not mysql:
            worker["options"] = {"backend": "sqlite", "max_rounds": worker["options"]["max_rounds"]}
            notes.append(f"{worker['name']}: on SQLite, MariaDB is not installed (apt-get install -y mariadb-server)")
        worker["replicas"] = 1
        workers.append(worker)
    stack["workers"] = workers
    return stack, notes


def write_smoke_stack(path: str | Path, token_file: str) -> list[str]:
    """Writes :func:`smoke_stack` for this host to ``path`` and returns its workers' names (the data's tasks); what
    it leaves out or changes goes to stderr."""
    stack, notes = smoke_stack(yaml.safe_load(RECIPE_STACK.read_text()), token_file,
                               docker=docker_available(), mysql=mariadb_available())
    for note in notes:
        print(f"smoke stack: {note}", file=sys.stderr)
    Path(path).write_text(yaml.safe_dump(stack))
    return [worker["name"] for worker in stack["workers"]]


def step_rows(metrics_file: Path) -> list[dict[str, float]]:
    """Each step's metrics from verl's ``file`` logger (one JSON object per line)."""
    rows = []
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        rows.append({"step": record["step"], **record["data"]})
    return rows


def generated_tokens(row: dict[str, float]) -> float:
    """Tokens the policy generated in the step: episodes x their mean generated tokens (``agentrl/all/*``)."""
    return row.get("agentrl/all/episodes", 0.0) * row.get("agentrl/all/generated_tokens", 0.0)


def gpu_peaks(gpu_csv: Path) -> tuple[float, float]:
    """Largest memory in use on the card (GiB) and mean utilisation (%) of ``nvidia-smi`` samples."""
    used, busy = [], []
    with gpu_csv.open() as f:
        for row in csv.reader(f):
            if len(row) >= 2 and row[0].strip().isdigit():
                used.append(float(row[0]) / 1024)
                busy.append(float(row[1]))
    return (max(used), sum(busy) / len(busy)) if used else (float("nan"), float("nan"))


def report(run_dir: Path) -> str:
    """Markdown: one row per step, then the card's peak memory and every rollout server's device."""
    rows = step_rows(run_dir / "metrics.jsonl")
    # Generated tokens per second of the whole step: under agentrl_async "gen" is the wait for a ready batch, not the
    # generation (episodes run while the previous step trains).
    head = ["step", *COLUMNS.values(), "generated tokens", "generated tokens/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        tokens = generated_tokens(row)
        cells = [str(row["step"])] + [f"{row[key]:.2f}" if key in row else "-" for key in COLUMNS]
        step = row.get("timing_s/step", 0.0)
        cells += [f"{tokens:.0f}", f"{tokens / step:.0f}" if step else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    if (run_dir / "gpu.csv").exists():
        peak, busy = gpu_peaks(run_dir / "gpu.csv")
        lines.append(f"\nGPU: peak memory in use {peak:.1f} GiB, mean utilisation {busy:.0f}% (nvidia-smi, every 2 s)")
    servers = SERVER_DEVICE.findall((run_dir / "run.log").read_text(errors="replace"))
    lines += [f"rollout server {name}: {device} ({dtype})" for name, device, dtype in dict.fromkeys(servers)]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="folder with metrics.jsonl, gpu.csv and run.log")
    print(report(parser.parse_args().run_dir))
