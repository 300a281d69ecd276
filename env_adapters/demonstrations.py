"""Expert demonstrations: a family's real sessions played in-process by its scripted expert.

A task's :meth:`~env_adapters.task.Task.expert` solves its generated items; :func:`generate_demonstrations` plays
them through the task's own sessions (no controller, no worker) and keeps the episodes it solved. Model warm-ups train
on them, and the tiny model's tokenizer is fitted to them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from env_adapters.protocol import Index, Message, ToolSchema, is_success
from env_adapters.task import Task, get_task_class, open_session

logger = logging.getLogger(__name__)

Expert = Callable[[Task, Index, list[Message]], Message]
"""A scripted policy: ``(task, index, messages so far) -> the next assistant message``."""


@dataclass
class Episode:
    """A finished episode: the full conversation, the tools offered, and the outcome."""

    task: str
    index: Index
    messages: list[Message]
    tools: list[ToolSchema]
    reward: float
    status: str

    @property
    def success(self) -> bool:
        return is_success(self.status, self.reward)


async def _demonstrate(task: Task, family: str, index: Index, expert: Expert, max_turns: int) -> Episode:
    session = await open_session(task, index)
    try:
        result = await session.reset()
        messages, tools = list(result.messages), list(result.tools or [])
        for _ in range(max_turns):
            if result.status.finished:
                break
            action = expert(task, index, messages)
            messages.append(action)
            result = await session.step(action)
            messages.extend(result.messages)
        return Episode(family, index, messages, tools, result.reward, result.status.value)
    finally:
        await session.close()


def generate_demonstrations(family: str, indices: Sequence[Index], task_options: dict[str, Any] | None = None,
                            expert: Expert | None = None, max_turns: int = 8) -> list[Episode]:
    """Run ``family``'s real sessions in-process with a scripted expert and keep the solved episodes.

    Args:
        family: Registered task family (e.g. ``calc``).
        indices: Sample indices to demonstrate (training indices only, never held-out ones).
        task_options: Keyword options of the task (the same as the worker's, so problems match).
        expert: Scripted policy; defaults to the task's own :meth:`~env_adapters.task.Task.expert`.
        max_turns: Safety bound on the expert's turns per episode.

    Returns:
        The episodes the expert solved (a failed one is logged: it means the expert or the task is wrong).
    """
    task_class = get_task_class(family)
    if expert is None and task_class.expert is Task.expert:
        raise KeyError(f"task family {family!r} has no scripted expert (Task.expert); give one with expert=")

    async def run_all() -> list[Episode]:
        task = task_class(**(task_options or {}))
        await task.setup()
        try:
            play = expert or (lambda task_, index, messages: task_.expert(index, messages))
            return [await _demonstrate(task, family, i, play, max_turns) for i in indices]
        finally:
            await task.teardown()

    episodes = asyncio.run(run_all())
    solved = [e for e in episodes if e.success]
    if len(solved) < len(episodes):
        logger.warning("expert for %s failed %d of %d episodes (dropped)", family, len(episodes) - len(solved),
                       len(episodes))
    return solved
