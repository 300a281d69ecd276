"""``chatter``: a multi-turn test task that any model can play, so episodes of a random tiny model last several turns.

Every assistant message gets a short user reply; the episode completes after ``rounds`` messages with reward = the
share of assistant messages whose length has the parity of the index (sampled messages vary in length, so rewards
vary within a group and GRPO really updates the actor; the index makes them vary across a batch even where greedy
decoding gives every prompt the same reply, so a batch-level baseline does too).
The first ``broken_sessions`` sessions a worker starts end ``task error`` at their first step (a task failing).
Loaded by the env worker as ``chatter_task:ChatterTask`` (its folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from env_adapters.protocol import Index, Message, SampleStatus
from env_adapters.task import Session, StepResult, Task, TaskError, function_tool

TOOLS = [function_tool("say", "Say something", {"text": {"type": "string"}})]


class ChatterSession(Session):
    def __init__(self, index: Index, rounds: int, latency: Callable[[], float] | None = None,
                 broken: bool = False) -> None:
        self.index, self.rounds, self.latency, self.seen, self.even = index, rounds, latency, 0, 0
        self.broken = broken

    async def reset(self) -> StepResult:
        return StepResult(messages=[{"role": "user", "content": f"Tell me about {self.index}."}], tools=TOOLS)

    async def step(self, message: Message) -> StepResult:
        if self.latency is not None:
            await asyncio.sleep(self.latency())
        if self.broken:
            raise TaskError("chatter: broken on purpose")
        self.seen += 1
        self.even += (len(str(message.get("content") or "")) + int(self.index)) % 2 == 0
        if self.seen >= self.rounds:
            return StepResult(status=SampleStatus.COMPLETED, reward=self.even / self.rounds)
        return StepResult(messages=[{"role": "user", "content": "Go on."}])


class ChatterTask(Task):
    # Seconds of environment delay per step (None: none); set by latency_chatter_task.LatencyChatterTask.
    latency: Callable[[], float] | None = None

    def __init__(self, rounds: int = 3, size: int = 64, broken_sessions: int = 0, **config: Any) -> None:
        super().__init__(**config)
        self.rounds, self.size, self.broken_sessions = int(rounds), int(size), int(broken_sessions)

    def indices(self) -> list[Index]:
        return list(range(self.size))

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> Session:
        self.broken_sessions -= 1
        return ChatterSession(index, self.rounds, self.latency, broken=self.broken_sessions >= 0)
