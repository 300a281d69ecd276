"""``held_chatter``: the ``chatter`` test task, with the episodes of all but the first prompts held at their first step.

Sessions of the first ``free_prompts`` distinct indices started play as ``chatter`` does; those of any later index
wait at their first step until ``release_file`` exists. So the asynchronous trainer's first batch is exactly the
free prompts' groups, and the held episodes are still to finish when the first weight update comes; the test hook
(``hold_update.py``) creates the file at that update and lets it land once a released episode is generating.
Loaded by the env worker as ``held_chatter_task:HeldChatterTask`` (this folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from chatter_task import ChatterSession, ChatterTask

from env_adapters.protocol import Index, Message
from env_adapters.task import Session, StepResult


class HeldChatterSession(ChatterSession):
    def __init__(self, index: Index, rounds: int, release_file: Path | None) -> None:
        super().__init__(index, rounds)
        self.release_file = release_file

    async def step(self, message: Message) -> StepResult:
        while self.release_file is not None and not self.release_file.exists():
            await asyncio.sleep(0.05)
        self.release_file = None
        return await super().step(message)


class HeldChatterTask(ChatterTask):
    def __init__(self, free_prompts: int, release_file: str, **config: Any) -> None:
        super().__init__(**config)
        self.free_prompts, self.release_file = int(free_prompts), Path(release_file)
        self.free: set[Index] = set()

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> Session:
        if index not in self.free and len(self.free) < self.free_prompts:
            self.free.add(index)
        return HeldChatterSession(index, self.rounds, None if index in self.free else self.release_file)
