"""What one session of a hostile policy makes a ``kg``, ``webshop`` or ``alfworld`` worker hold: the largest tool
arguments a request may carry (just under the 4 MB body limit), every round of an episode. Nothing of a session stays
once it has ended, and while it runs the worker holds a few copies of one request at most, not one per round.

Measured with ``tracemalloc`` (every Python allocation of the worker's code, in every thread), so the figures do not
depend on the allocator or on other tests running beside this one."""

from __future__ import annotations

import gc
import json
import tracemalloc

import pytest

from env_adapters.protocol import SampleStatus
from env_adapters.task import open_session
from env_adapters.tasks.kg.task import KGTask
from env_adapters.tasks.webshop import WebShopTask

REQUEST_CHARS = 3_900_000  # a tool argument just under the worker's 4 MB body limit
ROUNDS = 8
SESSIONS = 3
MiB = 1024 * 1024


def call(name: str, **arguments: str) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": function}]}


def kg_calls(round_: int) -> dict:  # distinct entity ids: nothing to share between rounds
    return call("get_relations", variable=f"m.{round_}" + "x" * REQUEST_CHARS)


def webshop_calls(round_: int) -> dict:
    return call("search_action", keywords=f"{round_} " + "shoes " * (REQUEST_CHARS // 6))


def alfworld_calls(round_: int) -> dict:
    return call("take_action", action=f"go to cabinet {round_} " + "x" * REQUEST_CHARS)


async def play(task, messages: list[dict]) -> None:
    session = await open_session(task, 0)
    await session.reset()
    try:
        for message in messages:
            if (await session.step(message)).status is not SampleStatus.RUNNING:
                break
    finally:
        await session.close()


async def retained_and_peak(task, messages: list[dict]) -> tuple[int, int]:
    """Bytes the worker's code still holds after ``SESSIONS`` sessions of ``messages`` (one session played first, so
    that lazily built state is not counted), and the most it held at once meanwhile, above where it started."""
    await play(task, messages)
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(SESSIONS):
            await play(task, messages)
        gc.collect()
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return now - start, peak - start


def kg_task() -> KGTask:
    return KGTask(preset="easy", size=1, max_rounds=ROUNDS + 1)


def webshop_task() -> WebShopTask:
    return WebShopTask(preset="easy", max_rounds=ROUNDS + 1)


def alfworld_task():
    pytest.importorskip("alfworld")
    from env_adapters.tasks.alfworld.task import ALFWorldTask

    return ALFWorldTask(size=1, task_types=["pick_and_place_simple"], max_receptacles=3, distractors=0,
                        max_step=ROUNDS + 1)


@pytest.mark.parametrize("family", ["kg", "webshop", "alfworld"])
async def test_a_session_of_maximal_requests_leaves_nothing_and_holds_a_few_copies_of_one(family):
    task = {"kg": kg_task, "webshop": webshop_task, "alfworld": alfworld_task}[family]()
    await task.setup()
    messages = [globals()[f"{family}_calls"](i) for i in range(ROUNDS)]  # made before measuring: the client's
    try:
        retained, peak = await retained_and_peak(task, messages)
    finally:
        await task.teardown()
    # Kept per session, the ids / keywords / actions would be 8 x 3.9 MB = 31 MB a session, 94 MB for three.
    assert retained < 1 * MiB, retained
    # Reading a call copies its request a few times at once (webshop: the parsed JSON, the action text, its UTF-8
    # check): that, not a copy per round.
    assert peak < 4 * REQUEST_CHARS, peak
