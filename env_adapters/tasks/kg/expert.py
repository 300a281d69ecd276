"""The scripted expert of ``kg``: plays an item's gold action trace through the tools, one call per message,
naming topic entities as the question does, then answers with the last variable."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from env_adapters.protocol import Index, Message
from env_adapters.tasks.kg.engine import PARAM_ORDER

if TYPE_CHECKING:  # the task calls this expert: a run-time import would be a cycle
    from env_adapters.tasks.kg.task import KGTask

_ACTION = re.compile(r"^\s*(\w+)\((.*)\)\s*$")
MAKES_VARIABLE = ("get_neighbors", "intersection", "argmax", "argmin", "count")


def parse_action(action: str) -> tuple[str, dict[str, str]]:
    """``"get_neighbors(m.0x,film.film.directed_by)"`` -> ``("get_neighbors", {"variable": ..., "relation": ...})``.

    Raises:
        ValueError: not a call of one of the seven tools with its number of arguments.
    """
    match = _ACTION.match(action)
    if match is None or match.group(1) not in PARAM_ORDER:
        raise ValueError(f"not a kg tool call: {action!r}")
    name, values = match.group(1), [v.strip() for v in match.group(2).split(",")]
    if len(values) != len(PARAM_ORDER[name]):
        raise ValueError(f"{action!r}: {name} takes {len(PARAM_ORDER[name])} argument(s)")
    return name, dict(zip(PARAM_ORDER[name], values, strict=True))


def _message(content: str, name: str | None = None, arguments: dict[str, Any] | None = None,
             call_id: str = "") -> Message:
    message: Message = {"role": "assistant", "content": content}
    if name is not None:
        function = {"name": name, "arguments": json.dumps(arguments)}
        message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
    return message


def kg_expert(task: KGTask, index: Index, messages: list[Message]) -> Message:
    """The next assistant message of the gold trace of ``task.items[index]`` given the conversation so far."""
    item = task.items[int(index)]
    names = {mid: name for name, mid in item["entities"].items()}
    done = sum(m["role"] == "tool" for m in messages)
    actions = item["actions"]
    if done < len(actions):
        name, arguments = parse_action(actions[done])
        arguments = {k: names.get(v, v) for k, v in arguments.items()}
        return _message("", name, arguments, call_id=f"call_{done}")
    made = sum(a.lstrip().startswith(MAKES_VARIABLE) for a in actions)
    return _message(f"Final Answer: #{made - 1}")
