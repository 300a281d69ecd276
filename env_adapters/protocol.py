"""Wire types of the AgentBench function-calling protocol (client <-> controller <-> worker).

Field names follow the upstream protocol exactly, including its one inconsistency: a worker answers with
``metric`` where the controller's client-facing answer says ``metrics``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Message = dict[str, Any]
"""An OpenAI chat message (``role``, ``content``, optional ``tool_calls`` / ``tool_call_id``)."""

ToolSchema = dict[str, Any]
"""An OpenAI tool schema (``{"type": "function", "function": {"name", "description", "parameters"}}``)."""

Index = int | str


class SampleStatus(str, Enum):
    """Status of a session; every value except ``running`` ends it."""

    RUNNING = "running"
    COMPLETED = "completed"
    AGENT_CONTEXT_LIMIT = "agent context limit"
    AGENT_VALIDATION_FAILED = "agent validation failed"
    AGENT_INVALID_ACTION = "agent invalid action"
    TASK_LIMIT_REACHED = "task limit reached"
    UNKNOWN = "unknown"
    TASK_ERROR = "task error"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self is not SampleStatus.RUNNING


class _Wire(BaseModel):
    # Upstream peers may send fields we do not know; keep them rather than fail.
    model_config = ConfigDict(extra="allow")


class TaskOutput(_Wire):
    """What a worker returns for start_sample and inside ``env_out`` of interact."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolSchema] | None = None
    status: SampleStatus = SampleStatus.RUNNING
    finish: bool = False
    reward: float = 0.0
    metric: dict[str, Any] = Field(default_factory=dict)


# ---- client -> controller -------------------------------------------------------------------------


class StartSampleRequest(_Wire):
    name: str
    index: Index = -1
    custom_task: dict[str, Any] | None = None


class StartSampleResponse(_Wire):
    """Body of start_sample; the session id travels in the ``session_id`` response header."""

    messages: list[Message]
    tools: list[ToolSchema] = Field(default_factory=list)


class InteractRequest(_Wire):
    messages: list[Message]


class InteractResponse(_Wire):
    finish: bool
    reward: float = 0.0
    status: SampleStatus
    messages: list[Message] = Field(default_factory=list)
    metrics: dict[str, Any] = Field(default_factory=dict)


# ---- controller <-> worker ------------------------------------------------------------------------


class Heartbeat(_Wire):
    name: str
    address: str
    concurrency: int
    indices: list[Index] = Field(default_factory=list)


class WorkerStartRequest(_Wire):
    index: Index = -1
    custom_task: dict[str, Any] | None = None
    session_id: int


class WorkerInteractRequest(_Wire):
    session_id: int
    messages: list[Message]


class WorkerInteractResponse(_Wire):
    session_id: int
    env_out: TaskOutput


class SessionIdBody(_Wire):
    session_id: int
