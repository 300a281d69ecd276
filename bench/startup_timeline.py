"""Where a command's time goes, process by process: when each process of its tree started, how much CPU it used and
when it ended (Linux ``/proc``, sampled every ``--interval`` seconds).

    python -m bench.startup_timeline --out timeline.json -- agentrl-verl demo ...

A verl run starts a chain of processes (the driver, Ray, the task runner, the worker group, rollout servers, load
balancers, the agent loop worker), each importing verl before it does anything: the table shows which of them the
first step waited for. The command's own output passes through; the table goes to stderr at the end, the last line
as ``key=value`` pairs. A process that lived less than one interval may be missed.

Results and how to read them: ``docs/gpu.md`` (the demo on one GPU) and ``docs/testing.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ProcessRecord:
    """One process of the command's tree; times in seconds since the command started."""

    pid: int
    name: str
    start_s: float
    cpu_s: float
    end_s: float | None = None


def _stat(pid: int) -> tuple[int, float, float] | None:
    """``(parent pid, CPU seconds, start time since boot in seconds)`` of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    except OSError:
        return None
    # After the name: state ppid ... utime(12) stime(13) ... starttime(20), counted from the state field.
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[19]) / CLOCK_TICKS


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return ""


def sample(root: int, records: dict[int, ProcessRecord], started: float) -> None:
    """Add or update every live descendant of ``root`` (and ``root``) in ``records``; mark the gone ones ended.
    Start times count from ``root``'s (the kernel's clock, exact to its ticks), end times from ``started``."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p))) is not None}
    if root not in stats:
        return
    root_start = stats[root][2]
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    tree, frontier = {root}, [root]
    while frontier:
        new = [pid for pid in children.get(frontier.pop(), []) if pid not in tree]
        tree.update(new)
        frontier.extend(new)
    now = time.time() - started
    for pid in tree & stats.keys():
        _, cpu, start = stats[pid]
        record = records.get(pid)
        if record is None:
            records[pid] = ProcessRecord(pid, _name(pid), round(start - root_start, 2), cpu)
        else:
            record.cpu_s = max(record.cpu_s, cpu)
            name = _name(pid)  # Ray's workers rename themselves for their actor; keep that name, not a later IDLE
            if name and not (name.startswith("ray::IDLE") and record.name.startswith("ray::")):
                record.name = name
    for pid, record in records.items():
        if record.end_s is None and pid not in tree:
            record.end_s = round(now, 2)


def run(command: list[str], interval: float) -> tuple[int, list[ProcessRecord], float]:
    """Run ``command`` to its end while sampling its process tree; its exit code, the processes, the wall time."""
    started = time.time()
    proc = subprocess.Popen(command)
    records: dict[int, ProcessRecord] = {}
    try:
        while proc.poll() is None:
            sample(proc.pid, records, started)
            time.sleep(interval)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
    wall = time.time() - started
    for record in records.values():
        record.end_s = record.end_s if record.end_s is not None else round(wall, 2)
    return proc.returncode, sorted(records.values(), key=lambda r: (r.start_s, r.pid)), wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write every process as JSON here")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("--min-cpu", type=float, default=1.0, help="list processes with at least this CPU (s)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    code, records, wall = run(command, args.interval)
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in records], indent=1))
    print(f"{'start_s':>8} {'end_s':>8} {'cpu_s':>7}  process", file=sys.stderr)
    for r in records:
        if r.cpu_s >= args.min_cpu:
            print(f"{r.start_s:8.1f} {r.end_s:8.1f} {r.cpu_s:7.1f}  {r.name[:100]}", file=sys.stderr)
    total = sum(r.cpu_s for r in records)
    print(f"exit_code={code} wall_s={wall:.1f} processes={len(records)} cpu_s={total:.1f}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
