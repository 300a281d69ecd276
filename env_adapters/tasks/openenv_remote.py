"""``openenv``: any OpenEnv environment (PyPI ``openenv`` 0.10) as a task family, so that ``agentrl_agent`` trains on
it beside the native families - the other direction of :mod:`env_adapters.openenv_serve`.

    workers:
      - task: openenv
        name: echo                  # the task name of the dataset rows and the per-task metrics
        concurrency: 8              # at most the server's max_concurrent_envs
        options: {url: "http://127.0.0.1:8000", size: 64, max_rounds: 3, end_at_limit: true}

Each session is one OpenEnv session (a WebSocket, through OpenEnv's own ``GenericEnvClient``):

- ``reset(seed=index, **reset_kwargs)`` for the indices ``0 .. size-1``. The opening is the reset observation's
  ``messages`` where it holds chat messages (this project's OpenEnv server sends them), else one user message:
  ``prompt``, then the observation.
- Tools. ``interface: action`` (any environment): one function, ``tool_name``, whose parameters are the environment's
  action schema (``GET /schema``, without its ``metadata``); a call's arguments are the action. ``interface: mcp`` (an
  MCP environment): the environment's tools (``list_tools``), a call is a ``call_tool`` action.
- An assistant message carries one call (an OpenEnv step takes one action); the step's observation is the call's
  reply: for ``mcp`` its ``result`` (or its ``error``), else the observation's fields other than ``reward``, ``done``
  and ``metadata``, as JSON. The step that ends the episode with an empty reply sends none.
- The episode's reward is the sum of its steps' rewards. ``done`` ends it ``completed``, or with the AgentBench status
  the observation's ``metadata`` names where it names one (this project's server does); after ``max_rounds`` messages
  it ends ``task limit reached``, or ``completed`` with ``end_at_limit`` (for environments whose episodes have no end,
  as the echo environment ``openenv init`` scaffolds).
- A message without a call or with several, or an action the environment refuses (its ``VALIDATION_ERROR``), is
  ``agent invalid action``; a server that stops answering loses the episode (not the policy's doing).
- However the session ends, its OpenEnv session is closed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from typing import Any, Literal

import httpx

from env_adapters.protocol import Index, Message, SampleStatus, ToolSchema
from env_adapters.task import (
    EnvironmentLost,
    InvalidAction,
    Session,
    StepResult,
    Task,
    TaskError,
    parse_tool_calls,
    register_task,
    tool_reply,
)

MESSAGE_TIMEOUT_S = 60.0
"""How long one reset or step may wait for the environment's answer."""
REFUSED_ACTION = "VALIDATION_ERROR"
"""OpenEnv's error code for an action its schema refuses (the client raises it as ``RuntimeError``)."""
OBSERVATION_EXTRAS = ("reward", "done", "metadata")


def action_tool(name: str, schema: dict[str, Any]) -> ToolSchema:
    """The OpenAI function whose arguments are the OpenEnv action ``schema`` (``GET /schema``'s ``action``)."""
    properties = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    parameters = {"type": "object", "properties": properties,
                  "required": [k for k in schema.get("required", []) if k in properties]}
    return {"type": "function", "function": {"name": name, "description": schema.get("description", ""),
                                             "parameters": parameters}}


def mcp_tool(tool: dict[str, Any]) -> ToolSchema:
    """An MCP tool (``list_tools``) as an OpenAI function."""
    return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""),
                                             "parameters": tool.get("input_schema") or {"type": "object"}}}


def render_observation(observation: dict[str, Any]) -> str:
    """An observation's own fields (not its reward, done or metadata) as the text the model reads."""
    return json.dumps({k: v for k, v in observation.items() if k not in OBSERVATION_EXTRAS}, ensure_ascii=False)


class OpenEnvSession(Session):
    """One OpenEnv session on the environment's server (see the module's docstring)."""

    def __init__(self, task: OpenEnvTask, index: Index) -> None:
        from openenv.core.generic_client import GenericEnvClient  # imports gradio: seconds, once per worker

        self.task, self.index = task, index
        self.client = GenericEnvClient(base_url=task.url, headers=task.headers, message_timeout_s=MESSAGE_TIMEOUT_S)
        self.connection = contextlib.AsyncExitStack()
        self.tools: list[ToolSchema] = []
        self.rounds, self.reward = 0, 0.0

    async def reset(self) -> StepResult:
        await self._send(self.connection.enter_async_context(self.client))
        result = await self._send(self.client.reset(seed=self.index, **self.task.reset_kwargs))
        observation = result.observation
        if self.task.interface == "mcp":
            listed = await self._send(self.client.step({"type": "list_tools"}))
            self.tools = [mcp_tool(t) for t in listed.observation.get("tools", [])]
        else:
            self.tools = [self.task.action_tool]
        opening = observation.get("messages")
        if not (isinstance(opening, list) and opening and all(isinstance(m, dict) and "role" in m for m in opening)):
            opening = [{"role": "user", "content": f"{self.task.prompt}\n\n{render_observation(observation)}".strip()}]
        return StepResult(messages=opening, tools=self.tools, metrics={"rounds": 0})

    async def step(self, message: Message) -> StepResult:
        self.rounds += 1
        calls = parse_tool_calls(message, self.tools)
        if len(calls) != 1:
            raise InvalidAction(f"call exactly one of the tools {[t['function']['name'] for t in self.tools]} per "
                                f"message (an OpenEnv step takes one action); this message has {len(calls)}")
        (call,) = calls
        action = ({"type": "call_tool", "tool_name": call.name, "arguments": call.arguments}
                  if self.task.interface == "mcp" else call.arguments)
        result = await self._send(self.client.step(action))
        observation = result.observation
        self.reward += float(result.reward or 0.0)
        if self.task.interface == "mcp":
            error = observation.get("error")
            reply = str(error.get("message", error)) if isinstance(error, dict) else observation.get("result")
            reply = reply if isinstance(reply, str) else json.dumps(reply, ensure_ascii=False)
        else:
            reply = render_observation(observation)
        status = SampleStatus.RUNNING
        if result.done:
            named = (observation.get("metadata") or {}).get("status")
            ended = {s.value for s in SampleStatus if s.finished}
            status = SampleStatus(named) if named in ended else SampleStatus.COMPLETED
        elif self.rounds >= self.task.max_rounds:
            status = SampleStatus.COMPLETED if self.task.end_at_limit else SampleStatus.TASK_LIMIT_REACHED
        # An empty reply to the step that ends the episode says nothing: no message (as a native family's last step).
        messages = [] if result.done and not reply else [tool_reply(call, reply)]
        return StepResult(messages, status, self.reward, {"rounds": self.rounds})

    async def close(self) -> None:
        await self.connection.aclose()

    async def _send(self, request):
        """Await a client request; the environment's refusal of an action is the model's, anything else is lost."""
        from websockets.exceptions import ConnectionClosed  # OpenEnv's transport

        try:
            return await request
        except RuntimeError as error:
            if REFUSED_ACTION in str(error):
                raise InvalidAction(f"the environment refused the action: {error}") from error
            raise EnvironmentLost(f"OpenEnv server {self.task.url}: {error}") from error
        except (OSError, TimeoutError, ConnectionClosed) as error:
            raise EnvironmentLost(f"OpenEnv server {self.task.url} did not answer: {error!r}") from error


@register_task("openenv")
class OpenEnvTask(Task):
    """An OpenEnv environment's server as a task family.

    Args:
        url: The environment server's base URL (``http://host:port``).
        size: How many indices (``reset`` seeds) it serves: ``0 .. size-1``.
        interface: ``action`` (one function whose arguments are the action) or ``mcp`` (the server's MCP tools).
        max_rounds: Assistant messages per episode.
        end_at_limit: End an episode that reaches ``max_rounds`` ``completed`` (with its rewards so far) instead of
            ``task limit reached``.
        tool_name: The function's name with ``interface: action``.
        prompt: The opening's text before the reset observation (where the server sends no chat messages).
        reset_kwargs: More keyword arguments of every ``reset`` (this project's server takes ``task``).
        token_env: An environment variable holding the server's bearer token (sent as ``Authorization``).
    """

    def __init__(self, url: str, size: int = 64, interface: Literal["action", "mcp"] = "action", max_rounds: int = 4,
                 end_at_limit: bool = False, tool_name: str = "step", prompt: str = "",
                 reset_kwargs: dict[str, Any] | None = None, token_env: str | None = None) -> None:
        super().__init__()
        if importlib.util.find_spec("openenv") is None:
            raise ImportError("the openenv task family needs the openenv package: pip install 'agentrl-verl[openenv]'")
        if interface not in ("action", "mcp"):
            raise ValueError(f"openenv: interface {interface!r}: use 'action' or 'mcp'")
        if size < 1 or max_rounds < 1:
            raise ValueError(f"openenv: size ({size}) and max_rounds ({max_rounds}) must be at least 1")
        self.url, self.size, self.interface, self.max_rounds = url.rstrip("/"), size, interface, max_rounds
        self.end_at_limit, self.tool_name, self.prompt = end_at_limit, tool_name, prompt
        self.reset_kwargs = dict(reset_kwargs or {})
        token = os.environ.get(token_env, "") if token_env else ""
        if token_env and not token:
            raise ValueError(f"openenv: token_env {token_env!r} names an unset or empty environment variable")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.action_tool: ToolSchema | None = None

    def indices(self) -> list[Index]:
        return list(range(self.size))

    async def setup(self) -> None:
        if self.interface == "action":
            async with httpx.AsyncClient(headers=self.headers, timeout=MESSAGE_TIMEOUT_S) as http:
                try:
                    response = await http.get(f"{self.url}/schema")
                    response.raise_for_status()
                except httpx.HTTPError as error:
                    raise TaskError(f"openenv: no action schema from {self.url}/schema: {error!r}") from error
            self.action_tool = action_tool(self.tool_name, response.json()["action"])

    async def healthy(self) -> bool:
        async with httpx.AsyncClient(headers=self.headers, timeout=5.0) as http:
            try:
                return (await http.get(f"{self.url}/health")).status_code == 200
            except httpx.HTTPError:
                return False

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> Session:
        if custom_task is not None or not isinstance(index, int) or not 0 <= index < self.size:
            raise TaskError(f"openenv: index {index!r} is not one of 0..{self.size - 1}")
        return OpenEnvSession(self, index)
