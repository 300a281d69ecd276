"""Session start latency of the ``os`` task with and without the pool of pre-started containers.

A session start is what a worker does for ``start_sample``: take a container (pooled, or create and start one),
run the item's init script, open the persistent shell. Sessions start one after another with a short think
time between them (as an agent's episodes do), each closed before the next; the same item list is used in
both modes. Usage::

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


async def measure(pool_size: int, sessions: int, gap: float) -> list[float]:
    """Seconds from ``start_session`` to the end of ``reset`` for ``sessions`` sequential sessions."""
    task = OSTask(split="dev", pool_size=pool_size, reap_interval=0)
    await task.setup()
    try:
        await asyncio.sleep(3.0 if pool_size else 0.0)  # let the pool fill, as in a worker that is up
        latencies = []
        for i in range(sessions):
            index = (6, 9, 13, 21)[i % 4]  # items with and without an init script
            t0 = time.monotonic()
            session = await task.start_session(index)
            try:
                await session.reset()
                latencies.append(time.monotonic() - t0)
            finally:
                await session.close()
            await asyncio.sleep(gap)
        return latencies
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
    for name, values in (("no pool", cold), (f"pool of {args.pool_size}", warm)):
        print(f"{name:>10}: p50 {statistics.median(values) * 1e3:6.0f} ms  p90 {percentile(values, 0.9) * 1e3:6.0f} ms"
              f"  max {max(values) * 1e3:6.0f} ms")
    print(f"sessions={args.sessions} pool_size={args.pool_size} "
          f"no_pool_p50_ms={statistics.median(cold) * 1e3:.0f} no_pool_p90_ms={percentile(cold, 0.9) * 1e3:.0f} "
          f"pool_p50_ms={statistics.median(warm) * 1e3:.0f} pool_p90_ms={percentile(warm, 0.9) * 1e3:.0f} "
          f"speedup_p50={statistics.median(cold) / statistics.median(warm):.1f}")


if __name__ == "__main__":
    main()
