"""``alfworld`` through the real controller and worker processes: the expert wins generated games (a sample by
default; with slow tests ``ALFWORLD_ORACLE_GAMES`` games, 24 unless set: the 500-game split is a run on demand,
``ALFWORLD_ORACLE_GAMES=500``, about 0.25 s of CPU per game; ``ALFWORLD_ORACLE_FIRST`` resumes from a game index,
and ``-s`` shows progress every 50 games), random admissible actions rarely win (on ``ALFWORLD_RANDOM_GAMES``
games, 24 unless set), invalid commands get "Nothing happens.", and a blocking engine never stalls the worker."""

from __future__ import annotations

import asyncio
import os
import random
import re
import time

import pytest

pytest.importorskip("alfworld")

from env_adapters.client import EnvClient  # noqa: E402
from env_adapters.protocol import SampleStatus  # noqa: E402
from env_adapters.tasks.alfworld.expert import expert  # noqa: E402
from env_adapters.tasks.alfworld.task import ALFWorldTask  # noqa: E402

REPLICAS = 2  # worker processes: each runs one engine call at a time
CONCURRENCY = 4  # sessions per worker process
SAMPLE = 6  # one game of each task type
ORACLE_GAMES = int(os.environ.get("ALFWORLD_ORACLE_GAMES", "24"))
ORACLE_FIRST = int(os.environ.get("ALFWORLD_ORACLE_FIRST", "0"))
RANDOM_GAMES = int(os.environ.get("ALFWORLD_RANDOM_GAMES", "24"))
PROGRESS = 50  # games between progress lines
# A step takes milliseconds and a game load a fraction of a second of CPU, but on a shared machine at load 40 a call
# can wait minutes for the CPU and a heartbeat (every 8 s) come more than 3 s late: the controller's defaults
# (interact 240 s, heartbeat 11 s) would end such sessions as if their worker hung or died.
SLOW_MACHINE = {"interact_timeout": 1200.0, "heartbeat_timeout": 120.0}


def _call(action: str, step: int) -> dict:
    import json

    function = {"name": "take_action", "arguments": json.dumps({"action": action})}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{step}", "type": "function",
                                                                "function": function}]}


def _admissible(content: str) -> list[str]:
    return [line for line in content.split("AVAILABLE ACTIONS: ", 1)[1].split("\n") if line]


async def play(env: EnvClient, index: int, choose) -> tuple[SampleStatus, float]:
    """Play game ``index``; ``choose(messages)`` gives the next assistant message."""
    started = await env.start_sample("alfworld", index)
    if started.status is not SampleStatus.RUNNING:  # ended at reset (its worker failed or was declared dead)
        return started.status, started.reward
    messages = list(started.messages)
    while True:
        message = choose(messages)
        response = await env.interact(started.session_id, message)
        messages += [message, *response.messages]
        if response.status is not SampleStatus.RUNNING:
            return response.status, response.reward


async def play_all(url: str, indices, choose_for, progress: bool = False) -> dict[int, tuple[SampleStatus, float]]:
    gate = asyncio.Semaphore(CONCURRENCY * REPLICAS)
    results = {}
    started = time.monotonic()

    async def one(env, index):
        async with gate:
            results[index] = await play(env, index, choose_for(index))
        if progress and (len(results) % PROGRESS == 0 or len(results) == len(indices)):
            won = sum(r == (SampleStatus.COMPLETED, 1.0) for r in results.values())
            print(f"alfworld oracle: {won}/{len(results)} won (of {len(indices)}), {time.monotonic() - started:.0f} s, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)

    async with EnvClient(url) as env:
        await asyncio.gather(*(one(env, i) for i in indices))
    return results


def expert_policy(task: ALFWorldTask):
    return lambda index: lambda messages: expert(task, index, messages)


def random_policy(seed: int):
    def choose_for(index):
        rng = random.Random(f"{seed}:{index}")
        return lambda messages: _call(rng.choice(_admissible(messages[-1]["content"])), len(messages))

    return choose_for


@pytest.fixture(scope="module")
def stack(env_stack):
    return env_stack("alfworld", options={"size": 500}, concurrency=CONCURRENCY, replicas=REPLICAS,
                     controller=SLOW_MACHINE)


async def test_expert_wins_a_sample_through_the_stack(stack):
    results = await play_all(stack.url, range(SAMPLE), expert_policy(ALFWorldTask(size=500)))
    assert results == {i: (SampleStatus.COMPLETED, 1.0) for i in range(SAMPLE)}


async def test_invalid_command_through_the_stack(stack):
    async with EnvClient(stack.url) as env:
        started = await env.start_sample("alfworld", 7)
        assert [t["function"]["name"] for t in started.tools] == ["take_action"]
        response = await env.interact(started.session_id, _call("xyzzy", 0))
        assert response.status is SampleStatus.RUNNING
        assert re.match(r"Nothing happens\. AVAILABLE ACTIONS: go to ", response.messages[0]["content"])
        await env.cancel(started.session_id)


@pytest.mark.slow
async def test_expert_wins_every_game_of_the_split(stack):
    games = range(ORACLE_FIRST, ORACLE_GAMES)
    results = await play_all(stack.url, games, expert_policy(ALFWorldTask(size=500)), progress=True)
    failures = {i: r for i, r in results.items() if r != (SampleStatus.COMPLETED, 1.0)}
    assert len(results) == len(games) and not failures, failures


@pytest.mark.slow
async def test_random_admissible_actions_rarely_win(stack):
    results = await play_all(stack.url, range(RANDOM_GAMES), random_policy(0))
    wins = sum(reward == 1.0 for _, reward in results.values())
    print(f"random admissible actions: {wins}/{RANDOM_GAMES} won")
    assert len(results) == RANDOM_GAMES and wins <= RANDOM_GAMES // 4  # measured: 0 of 500
