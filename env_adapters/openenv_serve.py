"""The tasks of an environment stack as one OpenEnv environment (PyPI ``openenv`` 0.10), for trainers that speak it.

    agentrl-env openenv --controller http://127.0.0.1:5020 --port 8010     # beside a running stack
    # or in a stack YAML:  openenv: {port: 8010}                            (started and stopped with the stack)

(``pip install agentrl-verl[openenv]`` brings the ``openenv`` package.)

One OpenEnv session (a WebSocket on ``/ws``, OpenEnv's simulation mode) plays one controller session at a time:

- ``reset(task=NAME, index=I)`` starts a session of task ``NAME`` on sample ``I`` (``start_sample``). The observation
  holds the opening ``messages`` and the ``tools`` (OpenAI function schemas). ``task`` may be left out where the stack
  serves one task; ``seed`` may stand for ``index`` (the task's ``seed``-th index, modulo their number). A reset while
  a session runs cancels that session first.
- ``step(ListToolsAction())`` answers the running session's tools as MCP tools.
- ``step(CallToolAction(tool_name=..., arguments=...))`` sends one assistant message holding that one tool call
  (``interact``). The observation's ``result`` is the text of the environment's reply, its ``metadata`` the reply's
  messages whole, the family's ``status`` and ``metrics``; ``reward`` and ``done`` are the family's own.
- ``step(MessageAction(content=...))`` sends an assistant message without a tool call (a text answer, as kg's
  ``Final Answer: #id``), answered the same way.
- The end of the OpenEnv session (its WebSocket closed, or the server reaping an idle one) cancels the running session,
  which gives back what it held (containers, databases).

What does not map: an assistant message with several tool calls, or text beside a call (AgentBench's function calling
takes both; an OpenEnv action is one call or one text), and rewards before the end (the families score an episode when
it ends).

The server refuses every request without the stack's token where it has one (``Authorization: Bearer``; OpenEnv's
clients send it with ``headers=``), and listens off loopback only with a token, as the controller does.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any, Literal

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (
    CallToolObservation,
    ListToolsObservation,
    Tool,
    ToolError,
    ToolErrorType,
)
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field, model_validator

from env_adapters.client import EnvClient, EnvRequestError, StartedSession
from env_adapters.http import TOKEN_ENV, check_bind
from env_adapters.protocol import Index, Message
from env_adapters.task import assistant_tool_call

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8010
CANCEL_TIMEOUT_S = 30.0
"""How long the end of an OpenEnv session waits for the controller to cancel its running session."""


class MessageAction(Action):
    """An assistant message without a tool call: a family that takes a text answer (kg's ``Final Answer: #id``)."""

    type: Literal["message"] = Field(default="message", description="action type")
    content: str = Field(description="the message's text")


class StepAction(Action):
    """What a step may carry, as the server reads it: OpenEnv's MCP actions (``call_tool``, ``list_tools``) or a
    :class:`MessageAction`. (OpenEnv reads MCP actions by their type only for an MCP action class; this one class
    takes all three.)"""

    type: Literal["call_tool", "list_tools", "message"] = Field(description="action type")
    tool_name: str | None = Field(default=None, description="call_tool: the tool")
    arguments: dict[str, Any] = Field(default_factory=dict, description="call_tool: its arguments")
    content: str | None = Field(default=None, description="message: the text")

    @model_validator(mode="after")
    def _complete(self) -> StepAction:
        if self.type == "call_tool" and not self.tool_name:
            raise ValueError("a call_tool action names its tool_name")
        if self.type == "message" and self.content is None:
            raise ValueError("a message action has its content")
        return self


class ReplyObservation(Observation):
    """The environment's reply to a :class:`MessageAction`."""

    result: str = Field(default="", description="the text of the environment's reply messages")


class TaskObservation(Observation):
    """What a reset answers: the session's opening."""

    task: str = Field(description="the task the session plays")
    index: Index = Field(description="the sample it plays")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the opening messages")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="the tools, as OpenAI function schemas")
    status: str = Field(description="the family's status: `running` unless the task ended at once")


def mcp_tools(tools: Sequence[dict[str, Any]]) -> list[Tool]:
    """OpenAI function schemas (``{"type": "function", "function": {...}}``) as MCP tools."""
    functions = [tool.get("function", tool) for tool in tools]
    return [Tool(name=f["name"], description=f.get("description", ""),
                 input_schema=f.get("parameters") or {"type": "object", "properties": {}}) for f in functions]


def reply_text(messages: Sequence[Message]) -> str:
    """The text of the environment's reply messages, one per line."""
    return "\n".join(str(m.get("content") or "") for m in messages)


class StackEnvironment(Environment):
    """One OpenEnv session over the controller's client API (a controller session at a time).

    Args:
        controller: The controller's URL.
        token: The stack's shared token, if it has one.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # each OpenEnv session has its own controller session

    def __init__(self, controller: str, token: str | None) -> None:
        super().__init__()
        self.client = EnvClient(controller, token=token)
        self.session: StartedSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = State()

    @property
    def state(self) -> State:
        return self._state

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TaskObservation:
        raise NotImplementedError("served asynchronously: reset_async")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        raise NotImplementedError("served asynchronously: step_async")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None, task: str | None = None,
                          index: Index | None = None, **kwargs: Any) -> TaskObservation:
        """Start a session (see the module's docstring); cancels the one running.

        Raises:
            ValueError: no task named where the stack serves several, or neither index nor seed.
            EnvRequestError: the controller refused the start (an unknown task or index: its answer says which).
        """
        self._loop = asyncio.get_running_loop()
        await self._cancel()
        if task is None:
            tasks = sorted(await self.client.list_workers())
            if len(tasks) != 1:
                raise ValueError(f"name the task to reset: reset(task=...), one of {tasks}")
            task = tasks[0]
        if index is None:
            if seed is None:
                raise ValueError("name the sample to play: reset(index=...) or reset(seed=...)")
            indices = await self.client.get_indices(task)
            index = indices[seed % len(indices)]
        self.session = await self.client.start_sample(task, index)
        self._state = State(episode_id=episode_id or str(self.session.session_id), step_count=0)
        return TaskObservation(task=task, index=index, messages=self.session.messages, tools=self.session.tools,
                               status=self.session.status.value, done=self.session.finished,
                               reward=self.session.reward if self.session.finished else None,
                               metadata={"metrics": self.session.metrics})

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """List the tools, or call one (see the module's docstring)."""
        if self.session is None or self.session.finished:
            raise RuntimeError("no session is running: reset first")
        kind = getattr(action, "type", None)  # StepAction from the wire; OpenEnv's own classes in-process
        if kind == "list_tools":
            return ListToolsObservation(tools=mcp_tools(self.session.tools))
        if kind == "call_tool":
            message = assistant_tool_call(action.tool_name, action.arguments, call_id=f"call_{uuid.uuid4().hex[:12]}")
        elif kind == "message":
            message = {"role": "assistant", "content": action.content}
        else:
            raise TypeError(f"{type(action).__name__}: this environment takes list_tools, call_tool or message")
        try:
            reply = await self.client.interact(self.session.session_id, message)
        except EnvRequestError as e:  # the controller refused it (e.g. the session ended on its own)
            self.session = None
            if kind == "message":
                raise
            return CallToolObservation(tool_name=action.tool_name, done=True,
                                       error=ToolError(error_type=ToolErrorType.EXECUTION_ERROR, message=e.detail))
        self._state.step_count += 1
        if reply.finish:
            self.session.status = reply.status
        outcome = {"result": reply_text(reply.messages), "done": reply.finish,
                   "reward": reply.reward if reply.finish else None,
                   "metadata": {"messages": reply.messages, "status": reply.status.value, "metrics": reply.metrics}}
        if kind == "message":
            return ReplyObservation(**outcome)
        return CallToolObservation(tool_name=action.tool_name, **outcome)

    async def _cancel(self) -> None:
        if self.session is not None and not self.session.finished:
            await self.client.cancel(self.session.session_id)
        self.session = None

    async def _end(self) -> None:
        try:
            await self._cancel()
        finally:
            await self.client.aclose()  # its connections to the controller

    def close(self) -> None:
        """Cancel the running session and close the client. OpenEnv calls this from the session's own thread when the
        session ends; the client lives on the server's event loop, so the cancel runs there."""
        loop = self._loop
        if loop is None or not loop.is_running():
            return  # never reset, or the server is gone (the controller's idle timeout ends the session)
        cancelled = asyncio.run_coroutine_threadsafe(self._end(), loop)
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if not on_loop:  # waiting on the loop's own thread would block the cancel it waits for
            cancelled.result(CANCEL_TIMEOUT_S)


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class RequireToken:
    """ASGI middleware: every HTTP request and WebSocket needs ``Authorization: Bearer <token>``."""

    def __init__(self, app: Callable[..., Awaitable[None]], token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong token"})
                else:
                    await send({"type": "http.response.start", "status": 401,
                                "headers": [(b"content-type", b"application/json")]})
                    await send({"type": "http.response.body", "body": b'{"detail": "missing or wrong token"}'})
                return
        await self.app(scope, receive, send)


def create_app(controller: str, token: str | None, max_sessions: int = 256) -> Callable[..., Awaitable[None]]:
    """The OpenEnv server's ASGI app over the stack whose controller is at ``controller``."""
    app = create_fastapi_app(lambda: StackEnvironment(controller, token), StepAction, CallToolObservation,
                             max_concurrent_envs=max_sessions, env_name="agentrl")
    return RequireToken(app, token) if token else app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--controller", required=True, help="the stack's controller URL")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; off it, a token is "
                        f"required: ${TOKEN_ENV}, as for the controller)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: any free port")
    parser.add_argument("--max-sessions", type=int, default=256, help="concurrent OpenEnv sessions")
    parser.add_argument("--url-file", default=None, help="write the server's URL here once it listens")


def run(args: argparse.Namespace) -> int:
    """``agentrl-env openenv``: serve a running stack's tasks as an OpenEnv environment until SIGTERM or Ctrl-C."""
    import uvicorn

    token = os.environ.get(TOKEN_ENV) or None
    check_bind(args.host, token)
    server = uvicorn.Server(uvicorn.Config(create_app(args.controller, token, args.max_sessions), host=args.host,
                                           port=args.port, log_level="warning"))

    async def serve() -> None:
        serving = asyncio.create_task(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started:
            url = f"http://{args.host}:{server.servers[0].sockets[0].getsockname()[1]}"
            logger.info("OpenEnv environment of the stack at %s up at %s", args.controller, url)
            if args.url_file:
                Path(args.url_file).write_text(url)
        await serving

    asyncio.run(serve())
    return 0
