"""Adding a task in one file: ``reverse`` asks the agent to reverse a word with a ``reverse`` tool and ``submit`` it.

A task is a :class:`~env_adapters.task.Task` (its indices; it opens sessions) and a session (one episode). Here the
session is a :class:`~env_adapters.task.ToolSession`: ``reset`` gives the opening messages and the tools, and one
``tool_<name>`` method per tool answers that tool's calls (its reply text, or a result that ends the episode); the
base counts rounds, refuses a message without a valid call (status ``agent invalid action``) and ends the episode at
``max_rounds``. A session that reads messages its own way subclasses :class:`~env_adapters.task.Session` (a blocking
engine :class:`~env_adapters.task.SyncSession`) and writes ``step`` itself. Serve it and train on it without
touching the project::

    PYTHONPATH=examples agentrl-env worker --task add_a_task:ReverseTask --name reverse \\
        --controller http://127.0.0.1:5020
    # or in a stack YAML:  workers: [{task: "add_a_task:ReverseTask", name: reverse, options: {size: 500}}]
    agentrl-verl make-data --controller http://127.0.0.1:5020 --task reverse --out data/reverse
"""

from __future__ import annotations

import random

from env_adapters.protocol import Index, SampleStatus
from env_adapters.task import StepResult, Task, TaskError, ToolCall, ToolSession, function_tool

TOOLS = [
    function_tool("reverse", "Reverse a string", {"text": {"type": "string"}}),
    function_tool("submit", "Submit the final answer", {"answer": {"type": "string"}}),
]
WORDS = ["agent", "policy", "reward", "verl", "rollout", "token", "session", "worker", "learning", "task"]


class ReverseSession(ToolSession):
    tools = TOOLS
    no_call_hint = "call reverse or submit"

    def __init__(self, word: str, max_rounds: int) -> None:
        self.word, self.max_rounds = word, max_rounds

    async def reset(self) -> StepResult:
        return StepResult(messages=[{"role": "user", "content": f"Reverse the word '{self.word}'."}], tools=TOOLS)

    async def tool_reverse(self, call: ToolCall) -> str:
        return str(call.arguments["text"])[::-1]

    async def tool_submit(self, call: ToolCall) -> StepResult:
        correct = call.arguments["answer"].strip() == self.word[::-1]
        return StepResult(status=SampleStatus.COMPLETED, reward=float(correct))


class ReverseTask(Task):
    """Options (the worker's ``--config`` YAML or a stack's ``options``): ``size`` indices, ``max_rounds``."""

    def __init__(self, size: int = 100, max_rounds: int = 4) -> None:
        self.size, self.max_rounds = size, max_rounds

    def indices(self) -> list[Index]:
        return list(range(self.size))

    async def start_session(self, index: Index, custom_task: dict | None = None) -> ReverseSession:
        if not (isinstance(index, int) and 0 <= index < self.size):
            raise TaskError(f"reverse: index must be in 0..{self.size - 1}, got {index!r}")
        return ReverseSession(random.Random(index).choice(WORDS), self.max_rounds)
