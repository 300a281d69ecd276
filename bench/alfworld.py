"""Latency and throughput of the ``alfworld`` task through a controller and a worker process.

``--concurrent`` clients each play sessions of generated games with random admissible actions (``--steps`` per
session, then a cancel), measuring ``start_sample`` (game load and reset) and ``interact`` (one engine step) as
the client sees them. ``--phases N`` instead plays the walkthroughs of games ``0..N-1`` in this process and prints
the CPU time of each phase of a game (generating it, loading it into the engine, reset, the steps). Usage::

    python -m bench.alfworld [--sessions 64] [--concurrent 32] [--steps 10] [--replicas 1]
    python -m bench.alfworld --phases 30

Results and how to read them: ``docs/environments/alfworld.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import time

from env_adapters.client import EnvClient
from env_adapters.launcher import EnvStack
from env_adapters.protocol import SampleStatus


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def action(rng: random.Random, content: str) -> dict:
    commands = [c for c in content.split("AVAILABLE ACTIONS: ", 1)[1].split("\n") if c]
    function = {"name": "take_action", "arguments": json.dumps({"action": rng.choice(commands)})}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": function}]}


async def run(url: str, sessions: int, concurrent: int, steps: int) -> tuple[list[float], list[float], float]:
    resets, interacts = [], []
    queue = list(range(sessions))

    async def client(env: EnvClient, rng: random.Random) -> None:
        while queue:
            index = queue.pop()
            t0 = time.perf_counter()
            started = await env.start_sample("alfworld", index)
            resets.append(time.perf_counter() - t0)
            content = started.messages[-1]["content"]
            for _ in range(steps):
                t0 = time.perf_counter()
                response = await env.interact(started.session_id, action(rng, content))
                interacts.append(time.perf_counter() - t0)
                if response.status is not SampleStatus.RUNNING:
                    break
                content = response.messages[-1]["content"]
            else:
                await env.cancel(started.session_id)

    async with EnvClient(url) as env:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(env, random.Random(i)) for i in range(concurrent)))
        return resets, interacts, time.perf_counter() - t0


def phases(games: int) -> None:
    """CPU seconds per game of each phase of an expert episode, in this process (after one warm-up game)."""
    from env_adapters.tasks.alfworld.engine import Game
    from env_adapters.tasks.alfworld.generator import Difficulty, generate

    Game(generate(0, "train", games, Difficulty())).close()  # imports and the grammar's parse
    totals, steps = dict.fromkeys(("generate", "load", "reset", "steps"), 0.0), 0
    for index in range(games):
        t0 = time.process_time()
        data = generate(0, "train", index, Difficulty())
        t1 = time.process_time()
        game = Game(data)
        t2 = time.process_time()
        observation = game.reset()
        t3 = time.process_time()
        for command in data["walkthrough"]:
            observation = game.step(command)
        t4 = time.process_time()
        game.close()
        if not observation.won:
            raise RuntimeError(f"game {index}: the walkthrough did not win")
        steps += len(data["walkthrough"])
        for name, seconds in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            totals[name] += seconds
    ms = {name: seconds / games * 1e3 for name, seconds in totals.items()}
    print(f"games={games} " + " ".join(f"{name}_ms={value:.0f}" for name, value in ms.items())
          + f" step_ms={totals['steps'] / steps * 1e3:.1f} game_cpu_ms={sum(ms.values()):.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=1, help="worker processes")
    parser.add_argument("--phases", type=int, default=0, help="time the phases of this many expert games instead")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.phases:
        phases(args.phases)
        return

    config = {"controller": {"port": 0, "start_wait": 600, "interact_timeout": 600},
              "workers": [{"task": "alfworld", "replicas": args.replicas, "concurrency": args.concurrent,
                           "options": {"size": max(args.sessions, 1)}}]}
    with EnvStack(config) as stack:
        resets, interacts, wall = asyncio.run(run(stack.url, args.sessions, args.concurrent, args.steps))
    ms = {name: (statistics.median(v) * 1e3, percentile(v, 0.99) * 1e3)
          for name, v in (("reset", resets), ("step", interacts))}
    for name, (p50, p99) in ms.items():
        print(f"{name:>6}: p50 {p50:7.0f} ms  p99 {p99:7.0f} ms")
    print(f"sessions={args.sessions} concurrent={args.concurrent} steps={args.steps} replicas={args.replicas} "
          f"reset_p50_ms={ms['reset'][0]:.0f} reset_p99_ms={ms['reset'][1]:.0f} step_p50_ms={ms['step'][0]:.1f} "
          f"step_p99_ms={ms['step'][1]:.1f} sessions_per_s={args.sessions / wall:.2f}")


if __name__ == "__main__":
    main()
