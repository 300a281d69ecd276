"""WebShop through the real controller and worker processes: the scripted expert earns reward 1 on generated goals
(a few dozen by default, a whole 500-goal split in the slow test), concurrently; a wrong purchase earns less."""

from __future__ import annotations

import asyncio

import pytest

from env_adapters.client import EnvClient
from env_adapters.protocol import SampleStatus
from env_adapters.tasks.webshop import WebShopTask
from env_adapters.tasks.webshop.expert import expert

FAST = {"generator": {"products": 1200, "goals": 200, "held_out": 50}}
FULL = {"generator": {"products": 5000, "goals": 1000, "held_out": 500}}  # the held-out split: 500 goals


async def play(env: EnvClient, task: WebShopTask, index: int) -> tuple[SampleStatus, float, dict]:
    """One episode of the expert through the controller (the same task options give the worker the same goals)."""
    started = await env.start_sample("webshop", index)
    messages, status, reward, metrics = list(started.messages), started.status, 0.0, {}
    for _ in range(task.max_rounds):
        if status is not SampleStatus.RUNNING:
            break
        action = expert(task, index, messages)
        response = await env.interact(started.session_id, action)
        messages += [action, *response.messages]
        status, reward, metrics = response.status, response.reward, response.metrics
    return status, reward, metrics


async def run_oracle(stack, options: dict, indices: list[int], concurrency: int = 8) -> list[tuple]:
    task = WebShopTask(**options)  # the expert's copy of the goals
    gate = asyncio.Semaphore(concurrency)
    async with EnvClient(stack.url) as env:
        assert await env.get_indices("webshop") == task.indices()

        async def one(index):
            async with gate:
                return index, *await play(env, task, index)

        return await asyncio.gather(*(one(i) for i in indices))


async def test_expert_through_controller(env_stack):
    stack = env_stack("webshop", options=FAST, concurrency=8)
    results = await run_oracle(stack, FAST, [*range(20), *range(180, 200)])  # held-out and training goals
    failed = [r for r in results if r[1:3] != (SampleStatus.COMPLETED, 1.0)]
    assert not failed, failed
    assert all(r[3]["score"] == 1.0 and r[3]["r_att"] == 1.0 for r in results)


async def test_wrong_purchase_through_controller(env_stack, tool_call):
    stack = env_stack("webshop", options=FAST, concurrency=8)
    task = WebShopTask(**FAST)
    goal = task.goal(0)
    other = next(p for p in task.shop.catalogue.products if p.query != goal.query)
    async with EnvClient(stack.url) as env:
        started = await env.start_sample("webshop", 0)
        await env.interact(started.session_id, tool_call("search_action", keywords=other.name))
        await env.interact(started.session_id, tool_call("click_action", value=other.asin))
        response = await env.interact(started.session_id, tool_call("click_action", value="Buy Now"))
    assert response.status is SampleStatus.COMPLETED and response.messages == []
    assert response.reward < 1.0 and response.metrics["score"] == response.reward
    assert response.metrics["query_match"] == 0.0 and not response.metrics["purchased_target"]


@pytest.mark.slow
async def test_expert_on_a_500_goal_split(env_stack):
    stack = env_stack("webshop", options=FULL, concurrency=16)
    results = await run_oracle(stack, FULL, list(range(500)), concurrency=16)
    failed = [r for r in results if r[1:3] != (SampleStatus.COMPLETED, 1.0)]
    assert len(results) == 500 and not failed, failed[:5]
