"""The task API a task author implements: a :class:`Task` that opens :class:`Session` objects.

A worker hosts one ``Task``. For every sample it calls :meth:`Task.start_session`, then
:meth:`Session.reset` once and :meth:`Session.step` once per assistant message, and finally
:meth:`Session.close` (always, whatever happened). Tasks return :class:`StepResult`; the worker
turns it into the wire format. Errors a task raises become status ``task error`` in one place (the
worker), so task code raises freely.

Blocking engines (TextWorld, a synchronous search index...) implement :class:`SyncSession` instead: the same
three methods, plain functions. The worker runs them in its bounded thread pool (``threads``, default its
``concurrency``), so a long step never stalls the worker's heartbeats or its other sessions. Async task code with
an occasional blocking call awaits :func:`run_blocking` for the same effect. A cancel cannot interrupt a call
running in a thread: the session ends at once for the client, and ``close`` runs when that call has returned.

Adding a task family whose episodes are tool calls (:class:`ToolSession`: one method per tool)::

    TOOLS = [function_tool("act", "Do something", {"x": {"type": "string"}})]  # sent by reset (StepResult.tools)

    class MySession(ToolSession):
        tools, no_call_hint, max_rounds = TOOLS, "the message has no tool call; call act", 8

        async def reset(self):
            return StepResult(messages=[{"role": "user", "content": "Do it."}], tools=TOOLS)

        async def tool_act(self, call):
            return StepResult(status=SampleStatus.COMPLETED, reward=float(call.arguments["x"] == "it"))

    @register_task("my_task")
    class MyTask(Task):
        def indices(self):
            return list(range(10))

        async def start_session(self, index, custom_task=None):
            return MySession()
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from env_adapters.protocol import Index, Message, SampleStatus, ToolSchema


class TaskError(Exception):
    """An environment-side failure; the session ends with status ``task error``."""


class EnvironmentLost(TaskError):
    """The environment lost the episode (a sandbox or a backend stopped answering), through no fault of the agent's:
    the session ends ``task error`` with the reason as its :data:`~env_adapters.protocol.ENV_LOST` metric, which
    tells a trainer to play the episode again."""


class InvalidAction(Exception):
    """The model's message cannot be executed (unknown tool, arguments that are not JSON...)."""


@dataclass
class StepResult:
    """What a session returns after reset or a step.

    Attributes:
        messages: New environment messages only (system/user prompt on reset, ``tool`` replies later).
        status: ``running`` keeps the session open; any other value ends it.
        reward: Final reward; meaningful once the session has ended.
        metrics: Free-form numbers for logging (per session).
        tools: Tool schemas; set on reset.
    """

    messages: list[Message] = field(default_factory=list)
    status: SampleStatus = SampleStatus.RUNNING
    reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    tools: list[ToolSchema] | None = None


class Session(ABC):
    """One episode of a task."""

    @abstractmethod
    async def reset(self) -> StepResult:
        """Prepare the environment and return the opening messages and the tools."""

    @abstractmethod
    async def step(self, message: Message) -> StepResult:
        """Apply one assistant message (OpenAI shape, possibly with ``tool_calls``)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release everything the session holds. Called exactly once, also after errors and cancels."""


class SyncSession(ABC):
    """One episode of a task whose engine blocks: :class:`Session`'s contract with plain (blocking) methods.

    The worker calls them in its thread pool, one at a time and in order, so the session needs no locking.
    """

    @abstractmethod
    def reset(self) -> StepResult:
        """Prepare the environment and return the opening messages and the tools."""

    @abstractmethod
    def step(self, message: Message) -> StepResult:
        """Apply one assistant message (OpenAI shape, possibly with ``tool_calls``)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release everything the session holds. Called exactly once, also after errors and cancels."""


_T = TypeVar("_T")
# The hosting worker's thread pool; unset outside a worker (then the event loop's default executor serves).
_BLOCKING_EXECUTOR: contextvars.ContextVar[Executor | None] = contextvars.ContextVar("blocking_executor",
                                                                                     default=None)


async def run_blocking(fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """Run a blocking call in the worker's bounded thread pool and await its result.

    Use it from async task code for calls that may block (a synchronous library, heavy CPU work): the event loop
    keeps serving heartbeats and the other sessions meanwhile. Cancelling the await does not stop a call that has
    started; it runs to its end in its thread.
    """
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_BLOCKING_EXECUTOR.get(), call)


def blocking_context(executor: Executor) -> contextvars.Context:
    """A context in which :func:`run_blocking` uses ``executor``: the worker runs task code in it."""
    context = contextvars.copy_context()
    context.run(_BLOCKING_EXECUTOR.set, executor)
    return context


class ThreadedSession(Session):
    """A :class:`SyncSession` behind the async interface: each method runs in the worker's thread pool (see
    :func:`run_blocking`).

    A lock keeps the calls in order even when a cancelled step is still running in its thread: ``close`` then
    waits for it, as the session's engine need not be thread-safe.
    """

    def __init__(self, session: SyncSession) -> None:
        self.session = session
        self._lock = threading.Lock()

    def _locked(self, method: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            return method(*args)

    async def reset(self) -> StepResult:
        return await run_blocking(self._locked, self.session.reset)

    async def step(self, message: Message) -> StepResult:
        return await run_blocking(self._locked, self.session.step, message)

    async def close(self) -> None:
        await run_blocking(self._locked, self.session.close)


class Task(ABC):
    """A task family instance, configured by keyword arguments from the worker's config."""

    needs_docker: ClassVar[bool] = False
    """Whether its sessions run in Docker containers: on a Ray cluster, its replicas may only land on nodes whose
    Docker daemon answers (:mod:`env_adapters.ray_stack` checks that before it places them)."""

    def __init__(self, **config: Any) -> None:
        if config:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(config)}")

    @abstractmethod
    def indices(self) -> list[Index]:
        """The sample indices this task serves."""

    @abstractmethod
    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None
                            ) -> Session | SyncSession:
        """Create (not yet reset) a session for ``index``, or for ``custom_task`` when index is -1."""

    async def setup(self) -> None:  # noqa: B027 - optional hook
        """Start shared resources (pools, servers) before the first session."""

    async def teardown(self) -> None:  # noqa: B027 - optional hook
        """Stop shared resources. Called once when the worker stops."""

    def expert(self, index: Index, messages: list[Message]) -> Message:
        """A scripted policy that solves this task's generated items (tests, warm-up demonstrations).

        Args:
            index: The sample index being played.
            messages: The conversation so far (the opening messages, then alternating assistant and tool turns).

        Returns:
            The next assistant message, with OpenAI ``tool_calls``.

        Raises:
            NotImplementedError: The family has no scripted expert.
        """
        raise NotImplementedError(f"task family {type(self).__name__} has no scripted expert")

    async def healthy(self) -> bool:
        """Whether the task can serve new sessions now (its backend answers); polled with every heartbeat.

        An unhealthy worker gets no new sessions from the controller until it is healthy again; its running
        sessions go on. Should answer within a few seconds: a check that runs longer than the worker's
        ``health_timeout`` counts as unhealthy, and an exception as unhealthy too.
        """
        return True


async def open_session(task: Task, index: Index, custom_task: dict[str, Any] | None = None) -> Session:
    """``task.start_session`` as an async :class:`Session` whatever form the task returns (a :class:`SyncSession`
    is wrapped in a :class:`ThreadedSession`): how the worker and in-process players open sessions."""
    session = await task.start_session(index, custom_task)
    return ThreadedSession(session) if isinstance(session, SyncSession) else session


def function_tool(
    name: str, description: str, properties: dict[str, Any], required: list[str] | None = None
) -> ToolSchema:
    """Build an OpenAI function tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties) if required is None else required,
            },
        },
    }


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


def parse_tool_calls(message: Message, tools: list[ToolSchema]) -> list[ToolCall]:
    """Extract the tool calls of an assistant message and validate them against ``tools``.

    Every malformed shape (``tool_calls`` not a list, a call without a ``function`` object, a name that is not a
    known tool, arguments that are not a JSON object or hold text that is not valid Unicode, a missing required
    argument) is the model's mistake, so it raises :class:`InvalidAction`, never another exception.

    Raises:
        InvalidAction: The message says which call is wrong and how, so the model can see its mistake.
    """
    known = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        return []
    if not isinstance(raw_calls, list):
        raise InvalidAction(f"'tool_calls' must be a list of calls, got {type(raw_calls).__name__}")
    calls = []
    for i, raw in enumerate(raw_calls):
        fn = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(fn, dict):
            raise InvalidAction(f"tool call {i} must be an object with a 'function' object holding 'name' and "
                                f"'arguments', got {_preview(raw)}")
        name = fn.get("name")
        if not isinstance(name, str) or name not in known:
            raise InvalidAction(f"unknown tool {_preview(name)}; available: {sorted(known)}")
        args = fn.get("arguments")
        if args is None or args == "":  # no arguments at all: as an empty object
            args = {}
        elif isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                raise InvalidAction(f"arguments of {name!r} are not valid JSON: {e}") from e
        if not isinstance(args, dict):
            raise InvalidAction(f"arguments of {name!r} must be a JSON object, got {type(args).__name__}")
        try:  # JSON escapes can spell a lone UTF-16 surrogate ("\ud800"), which no shell or database accepts
            json.dumps(args, ensure_ascii=False).encode()
        except UnicodeEncodeError as e:
            raise InvalidAction(f"arguments of {name!r} contain text that is not valid Unicode: {e.reason} "
                                f"({e.object[e.start:e.end]!a})") from e
        missing = [k for k in known[name].get("required", []) if k not in args]
        if missing:
            raise InvalidAction(f"{name!r} is missing required argument(s) {missing}")
        call_id = raw.get("id") or f"call_{i}"
        if not isinstance(call_id, str):
            raise InvalidAction(f"tool call {i}: 'id' must be a string, got {_preview(call_id)}")
        calls.append(ToolCall(id=call_id, name=name, arguments=args))
    return calls


def _preview(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def assistant_tool_call(name: str, arguments: dict[str, Any], call_id: str = "call_0", content: str = "") -> Message:
    """An assistant message calling one tool (what a scripted expert returns)."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": call_id, "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)}}],
    }


def tool_reply(call: ToolCall, content: str) -> Message:
    """The environment's answer to one tool call."""
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


class ToolSession(Session):
    """A session whose step runs the message's tool calls in order: a new family is its tools as ``tool_<name>``.

    Each step counts a round and parses the calls with :func:`parse_tool_calls` (a malformed one is
    ``agent invalid action``; so is a message without a call, with :attr:`no_call_hint` as the reason). A tool method
    ``async def tool_<name>(self, call) -> str | StepResult`` returns the reply's text, and the step goes on with the
    next call, or a :class:`StepResult` that ends the episode (the replies so far come before its messages). After
    the last call the session goes on, or ends ``task limit reached`` once :attr:`rounds` reaches :attr:`max_rounds`.
    Families whose upstream reads calls its own way (``kg``, ``webshop``, ``alfworld``) implement ``step`` themselves.
    """

    tools: list[ToolSchema]
    """The family's tool schemas (what :meth:`reset` sends)."""
    no_call_hint: str
    """Why a message without a tool call is refused, naming the tools to call."""
    max_rounds: int
    """Assistant messages allowed per episode."""
    rounds: int = 0
    """Assistant messages so far."""

    def step_metrics(self) -> dict[str, Any]:
        """The session's metrics, sent with every step's result."""
        return {"rounds": self.rounds}

    async def step(self, message: Message) -> StepResult:
        self.rounds += 1
        calls = parse_tool_calls(message, self.tools)
        if not calls:
            raise InvalidAction(self.no_call_hint)
        replies = []
        for call in calls:
            outcome = await getattr(self, f"tool_{call.name}")(call)
            if isinstance(outcome, StepResult):
                outcome.messages[:0] = replies
                return outcome
            replies.append(tool_reply(call, outcome))
        status = SampleStatus.TASK_LIMIT_REACHED if self.rounds >= self.max_rounds else SampleStatus.RUNNING
        return StepResult(replies, status, 0.0, self.step_metrics())


# ---- registry ------------------------------------------------------------------------------------

_TASKS: dict[str, type[Task]] = {}
# Built-in families are imported on first use so that heavy dependencies (docker, pymysql) load lazily.
_BUILTIN_MODULES = {
    "calc": "env_adapters.tasks.calculator",
    "os": "env_adapters.tasks.os_interaction",
    "db": "env_adapters.tasks.dbbench",
    "kg": "env_adapters.tasks.kg",
    "webshop": "env_adapters.tasks.webshop",
    "alfworld": "env_adapters.tasks.alfworld",
    "openenv": "env_adapters.tasks.openenv_remote",
}


def register_task(name: str):
    """Class decorator registering a task family under ``name``."""

    def wrap(cls: type[Task]) -> type[Task]:
        _TASKS[name] = cls
        return cls

    return wrap


def task_families() -> list[str]:
    """Names of the registered and built-in task families."""
    return sorted(set(_TASKS) | set(_BUILTIN_MODULES))


def get_task_class(name: str) -> type[Task]:
    """Look up a task family by registered name or by ``package.module:ClassName``."""
    if ":" in name:
        module, _, attr = name.partition(":")
        return getattr(importlib.import_module(module), attr)
    if name not in _TASKS and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _TASKS:
        raise KeyError(f"unknown task family {name!r}; known: {task_families()} "
                       "or give 'package.module:ClassName'")
    return _TASKS[name]
