"""Types of the AgentBench function-calling protocol (client <-> controller <-> worker).

The controller and the worker read and write the JSON bodies directly (see their routes); field names follow the
upstream protocol exactly, including its one inconsistency: a worker answers with ``metric`` where the
controller's client-facing answer says ``metrics``.
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

ENV_LOST = "env_lost"
"""Metric of a session the environment, not the agent, ended (an extension; upstream clients ignore it): why. A
trainer plays such an episode again rather than train on it."""


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


class InteractResponse(BaseModel):
    """The controller's answer to an interact (what :meth:`env_adapters.client.EnvClient.interact` returns)."""

    # Upstream controllers may send fields we do not know; keep them rather than fail.
    model_config = ConfigDict(extra="allow")

    finish: bool
    reward: float = 0.0
    status: SampleStatus
    messages: list[Message] = Field(default_factory=list)
    metrics: dict[str, Any] = Field(default_factory=dict)


def is_success(status: str, env_reward: float) -> bool:
    """An episode succeeded when the environment ended it ``completed`` with full reward (1.0).

    Partial rewards (a WebShop purchase that matches some attributes) count toward the mean reward, not success:
    upstream's success rate is the share of full rewards.
    """
    return status == SampleStatus.COMPLETED.value and float(env_reward) >= 1.0
