"""What the benches share: running runs side by side on shares of the CPUs, resuming a run's saved record, and the
mean with its standard error. Each bench's own experiment stays in its file; the benches and their pages:
``docs/testing.md``."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench")


def cpu_shares(cpus: set[int], parts: int) -> list[set[int]]:
    """``cpus`` cut into ``parts`` equal shares of neighbouring CPUs (the remainder in none).

    Raises:
        ValueError: fewer CPUs than shares.
    """
    ordered = sorted(cpus)
    size = len(ordered) // parts
    if size == 0:
        raise ValueError(f"--pin: {len(ordered)} CPUs cannot give {parts} runs or pairs one each")
    return [set(ordered[i * size:(i + 1) * size]) for i in range(parts)]


def cpu_list(cpus: set[int]) -> str:
    """``cpus`` as ranges, as taskset writes them: ``0-5,12``."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


@contextlib.contextmanager
def cpu_affinity(cpus: set[int] | None) -> Iterator[None]:
    """Processes this thread starts inside the block run on ``cpus`` (None: no change). On Linux the affinity is
    the calling thread's, and a child inherits that of the thread that started it, so other threads are unaffected."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def run_processes(commands: dict[str, tuple[list[str], Path]], parallel: int, pin: bool, stop_s: float) -> list[str]:
    """Run each command (name -> command line, log file) in its own process group, ``parallel`` at once, in order,
    its output appended to its log; with ``pin`` each on a share of this process's CPUs (:func:`cpu_shares`), handed
    to the next command when it ends. On an error, Ctrl-C or SIGTERM here, the running ones get SIGTERM (each stops
    its verl run and environment stack) and SIGKILL after ``stop_s``.

    Returns:
        The names of the commands that failed (the others ran to their end).
    """
    pending = list(commands)
    running: dict[str, subprocess.Popen] = {}
    free = cpu_shares(os.sched_getaffinity(0), parallel) if pin else []
    shares: dict[str, set[int]] = {}
    failed = []
    try:
        while pending or running:
            while pending and len(running) < parallel:
                name = pending.pop(0)
                cmd, log_path = commands[name]
                if free:
                    shares[name] = free.pop(0)
                with open(log_path, "a") as log, cpu_affinity(shares.get(name)):
                    running[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                     start_new_session=True)
                logger.info("%s: started (log %s)%s", name, log_path,
                            f" on CPUs {cpu_list(shares[name])}" if name in shares else "")
            for name, proc in list(running.items()):
                if proc.poll() is not None:
                    del running[name]
                    if name in shares:
                        free.append(shares.pop(name))
                    logger.info("%s: %s", name, "done" if proc.returncode == 0 else f"failed ({proc.returncode})")
                    if proc.returncode != 0:
                        failed.append(name)
            time.sleep(2)
    finally:
        for proc in running.values():
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in running.values():
            try:
                proc.wait(timeout=stop_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return failed


def saved_record(path: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """A run's record (``pair.json`` here, ``run.json`` of ``bench.ablation``; None without one).

    Raises:
        ValueError: it was made with other settings (resuming would mix two experiments).
    """
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record.get("settings") != settings:
        raise ValueError(f"{path} was made with settings {record.get('settings')}, not {settings}: use another --out")
    return record


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample standard deviation / sqrt(n); 0 for one value)."""
    if not values:
        raise ValueError("mean_and_se of no values")
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)
