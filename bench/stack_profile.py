"""Where each process of a run spends its time, from py-spy's sampled stacks (``py-spy record --subprocesses
--format raw``): per process, the samples and the functions most often on its stack.

    py-spy record --subprocesses --nonblocking -r 25 --format raw -o stacks.txt -- agentrl-verl demo ...
    python -m bench.stack_profile stacks.txt --within update_actor --top 25

A frame's share is the fraction of the process's samples (or, with ``--within``, of the samples whose stack holds
that function) with the frame anywhere on the stack: nested frames add up to more than 100%. py-spy leaves out the
samples of idle threads (unless recorded with ``--idle``), so a share is of the time the process was at work.
``bench/device_demo_gpu.sh`` records the demo this way with ``PYSPY=1``; results and how to read them: ``docs/gpu.md``.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PROCESS = re.compile(r'^process (\d+):"(.*)"$', re.S)


@dataclass
class ProcessStacks:
    """The samples of one process: its command line, and each stack (outermost frame first) with its count."""

    pid: int
    command: str
    stacks: Counter = field(default_factory=Counter)

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())

    def frame_shares(self, within: str | None = None) -> tuple[int, list[tuple[str, float]]]:
        """The samples counted (all, or those with a frame whose function is ``within``) and each frame's share of
        them, largest first."""
        counted, frames = 0, Counter()
        for stack, count in self.stacks.items():
            if within is not None and not any(within in _suffixes(frame) for frame in stack):
                continue
            counted += count
            for frame in set(stack):
                frames[frame] += count
        return counted, [(frame, n / counted) for frame, n in frames.most_common()] if counted else []


def _function(frame: str) -> str:
    return frame.split(" (", 1)[0]


def _suffixes(frame: str) -> list[str]:
    """The frame's function as ``--within`` may name it: qualified (``Worker.update_actor``) or not."""
    parts = _function(frame).split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


def parse(text: str) -> dict[int, ProcessStacks]:
    """py-spy's raw output (``frame;frame;... count`` lines, each stack led by its ``process PID:"cmd"`` frame;
    command lines may span lines) by process id."""
    processes: dict[int, ProcessStacks] = {}
    for record in re.split(r"\n(?=process \d+:\")", text.strip()):
        body, _, count = record.rpartition(" ")
        if not count.isdigit():
            continue
        frames = body.split(";")
        # Led by the process frames of the sampled process and its ancestors: the last of them is the process.
        leading = [i for i, frame in enumerate(frames) if PROCESS.match(frame)]
        if not leading:
            continue
        match = PROCESS.match(frames[leading[-1]])
        pid, command = int(match.group(1)), " ".join(match.group(2).split())
        process = processes.setdefault(pid, ProcessStacks(pid, command))
        process.stacks[tuple(frames[leading[-1] + 1:])] += int(count)
    return processes


def report(processes: dict[int, ProcessStacks], top: int, within: str | None, min_samples: int) -> str:
    """The text report: one block per process with at least ``min_samples`` counted samples, busiest first."""
    blocks = []
    for process in sorted(processes.values(), key=lambda p: p.samples, reverse=True):
        counted, shares = process.frame_shares(within)
        if counted < min_samples:
            continue
        scope = f"{counted} samples with {within} on the stack" if within else f"{counted} samples"
        lines = [f"## pid {process.pid}: {process.command[:140]}", f"{scope}"]
        lines += [f"  {share:6.1%}  {frame[:150]}" for frame, share in shares[:top]]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stacks", type=Path, help="py-spy record --format raw output (with --subprocesses)")
    parser.add_argument("--within", default=None,
                        help="count only samples with this function on the stack (qualified or its last part)")
    parser.add_argument("--top", type=int, default=20, help="frames shown per process")
    parser.add_argument("--min-samples", type=int, default=50, help="leave out processes with fewer samples")
    args = parser.parse_args(argv)
    print(report(parse(args.stacks.read_text(errors="replace")), args.top, args.within, args.min_samples), end="")


if __name__ == "__main__":
    main()
