"""Session start latency of the ``os`` task with and without the pool of pre-started containers.

A session start is what a worker does for ``start_sample``: the hand-over (take a container with its limits set and
the agent's login shell open: a pooled one, or one created, started and given its shell on demand), then the
item's init scripts. Sessions start one after another with a short think time between them (as an agent's episodes
do), each closed before the next; the same item list is used in both modes. Printed: p50 and p99 of the hand-over
and of the whole start, both ways, and their ratios. Usage::

    python -m bench.env_start [--sessions 20] [--pool-size 2] [--gap 0.5]

Results and how to read them: ``docs/environments/index.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time

from env_adapters.tasks.os_interaction import OSTask


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(pool_size: int, sessions: int, gap: float) -> tuple[list[float], list[float]]:
    """Seconds of the hand-over and of the whole ``reset`` for ``sessions`` sequential sessions."""
    task = OSTask(split="dev", pool_size=pool_size, reap_interval=0)
    await task.setup()
    try:
        await asyncio.sleep(3.0 if pool_size else 0.0)  # let the pool fill, as in a worker that is up
        handovers, starts = [], []
        for i in range(sessions):
            index = (6, 9, 13, 21)[i % 4]  # items with and without an init script
            t0 = time.monotonic()
            session = await task.start_session(index)
            try:
                await session.reset()
                starts.append(time.monotonic() - t0)
                handovers.append(session.handover_seconds)
            finally:
                await session.close()
            await asyncio.sleep(gap)
        return handovers, starts
    finally:
        await task.teardown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between a close and the next start")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    cold = asyncio.run(measure(0, args.sessions, args.gap))
    warm = asyncio.run(measure(args.pool_size, args.sessions, args.gap))
    figures = {}
    for part, i in (("handover", 0), ("start", 1)):
        for mode, values in (("no_pool", cold[i]), ("pool", warm[i])):
            figures[f"{mode}_{part}_p50_ms"] = statistics.median(values) * 1e3
            figures[f"{mode}_{part}_p99_ms"] = percentile(values, 0.99) * 1e3
        print(f"{part:>9}: no pool p50 {figures[f'no_pool_{part}_p50_ms']:8.2f} ms p99 "
              f"{figures[f'no_pool_{part}_p99_ms']:8.2f} ms | pool of {args.pool_size} p50 "
              f"{figures[f'pool_{part}_p50_ms']:8.2f} ms p99 {figures[f'pool_{part}_p99_ms']:8.2f} ms | "
              f"p50 ratio {figures[f'no_pool_{part}_p50_ms'] / figures[f'pool_{part}_p50_ms']:.1f}x")
    print(f"sessions={args.sessions} pool_size={args.pool_size} "
          + " ".join(f"{key}={value:.2f}" for key, value in figures.items()))


if __name__ == "__main__":
    main()
