"""The scripted ALFWorld expert: the game's walkthrough (``ALFWorldTask.walkthrough``: a generated game's own, else
the planner's), one ``take_action`` call per turn."""

from __future__ import annotations

import json

from env_adapters.protocol import Index, Message
from env_adapters.task import Task


def expert(task: Task, index: Index, messages: list[Message]) -> Message:
    """The next assistant message of an episode of ``task`` (an ``ALFWorldTask``) on ``index``.

    The walkthrough wins from the initial state and the engine is deterministic, so the k-th tool reply of the
    conversation tells where in the walkthrough the episode is.
    """
    step = sum(1 for m in messages if m.get("role") == "tool")
    action = task.walkthrough(index)[step]
    call = {"id": f"call_{step}", "type": "function",
            "function": {"name": "take_action", "arguments": json.dumps({"action": action})}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}
