"""The single-GPU recipe's smoke run, summarised: per-step times, generated tokens/s, weight updates, GPU memory.

    bash bench/device_recipe_1gpu.sh      # on a lent GPU machine: recipes/agentrl/run.sh 1gpu, 3 steps
    python -m bench.gpu_recipe DIR        # the table of DIR/metrics.jsonl, DIR/gpu.csv and DIR/run.log

Results and how to read them: ``docs/results/gpu-recipe.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

COLUMNS = {
    "timing_s/step": "step s",
    "timing_s/gen": "gen s",
    "timing_s/update_actor": "update_actor s",
    "timing_s/update_weights": "weight update s",
    "timing_s/update_stale_weights": "stale refresh s",
    "actor/perf/max_memory_allocated_gb": "actor peak GiB",
}
SERVER_DEVICE = re.compile(r"hf rollout server (\S+): \S+ on (\S+) \((\S+)\)")


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
