"""``chatter``: a multi-turn test task that any model can play, so episodes of a random tiny model last several turns.

Every assistant message gets a short user reply; the episode completes after ``rounds`` messages with reward = the
share of assistant messages of even length (rewards vary within a group, so GRPO really updates the actor).
Loaded by the env worker as ``chatter_task:ChatterTask`` (its folder on ``PYTHONPATH``).
"""

from __future__ import annotations

from typing import Any

from env_adapters.protocol import Index, Message, SampleStatus
from env_adapters.task import Session, StepResult, Task, function_tool

TOOLS = [function_tool("say", "Say something", {"text": {"type": "string"}})]


class ChatterSession(Session):
    def __init__(self, index: Index, rounds: int) -> None:
        self.index, self.rounds, self.seen, self.even = index, rounds, 0, 0

    async def reset(self) -> StepResult:
        return StepResult(messages=[{"role": "user", "content": f"Tell me about {self.index}."}], tools=TOOLS)

    async def step(self, message: Message) -> StepResult:
        self.seen += 1
        self.even += len(str(message.get("content") or "")) % 2 == 0
        if self.seen >= self.rounds:
            return StepResult(status=SampleStatus.COMPLETED, reward=self.even / self.rounds)
        return StepResult(messages=[{"role": "user", "content": "Go on."}])


class ChatterTask(Task):
    def __init__(self, rounds: int = 3, size: int = 64, **config: Any) -> None:
        super().__init__(**config)
        self.rounds, self.size = int(rounds), int(size)

    def indices(self) -> list[Index]:
        return list(range(self.size))

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> Session:
        return ChatterSession(index, self.rounds)
