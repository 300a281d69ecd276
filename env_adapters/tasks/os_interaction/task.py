"""``os``: AgentBench OS interaction. Each session gets its own Docker container and a persistent bash in it.

A session does what upstream AgentBench does, in its order: it takes a container of the item's image flavour
(from the pool; working directory ``/root``), opens the agent's login shell, runs the item's ``init`` scripts each
in a fresh process (an init that fails ends the session with ``task error``, its reason in the metrics), then
types the item's ``start`` into the agent's shell (so what it sets, the directory and the user it switches to
are what the agent's first command sees). The agent has three tools:
``bash_action`` (run a script in the shell; output cut at ``output_limit`` characters, ``command_timeout``
seconds per command), ``answer_action`` (submit an answer) and ``finish_action`` (declare the task done, for
items checked by a script). The answer is scored by exact match or by the item's check chain: each link is a
script run in the container with the answer and the previous links' outputs (stdout and stderr) as arguments,
a null link standing for the item's ``example`` script; every link must exit with 0.

Statuses: ``completed`` after an answer or finish (reward 1.0 when correct, else 0.0); ``task limit reached``
after ``max_rounds`` assistant messages without one; ``agent invalid action`` for a message without a valid
tool call, or when the agent's commands made the container unusable (e.g. a fork bomb at the pids limit) or,
where the Docker daemon cannot bound a container's disk, wrote more than the disk limit (where it can, a write
past the limit fails and the session goes on). The metrics carry ``score`` (the reward; upstream clients report it as
``metric_score``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import docker
import docker.errors

from env_adapters.protocol import Index, SampleStatus
from env_adapters.sandbox.containers import DOCKER_RESOURCE, ContainerPool, Limits
from env_adapters.sandbox.images import ensure_image
from env_adapters.sandbox.shell import CommandResult, PersistentShell, ProcessResult, ShellBroken, exec_bounded
from env_adapters.task import (
    EnvironmentLost,
    StepResult,
    Task,
    TaskError,
    ToolCall,
    ToolSession,
    function_tool,
    register_task,
    tool_reply,
)
from env_adapters.tasks.os_interaction.items import (
    VENDORED_SCRIPTS,
    OSItem,
    Script,
    load_items,
    load_sources,
    load_split,
    parse_item,
    scripts_folder,
)

logger = logging.getLogger(__name__)

# Image of each `create.local` flavour (keys of env_adapters.sandbox.images.IMAGES).
FLAVOUR_IMAGES = {"default": "os-default", "packages": "os-packages", "ubuntu": "os-ubuntu"}

TOOLS = [
    function_tool("bash_action", "Run a bash script in the Linux machine and see its output (stdout and stderr).",
                  {"script": {"type": "string", "description": "the bash script; it must not read input"}}),
    function_tool("answer_action", "Give your final answer to the question; this ends the task.",
                  {"answer": {"type": "string", "description": "the answer only, without explanation"}}),
    function_tool("finish_action", "Declare that you have finished the requested operation; this ends the task.",
                  {"thought": {"type": "string", "description": "a short summary of what you did"}}),
]

SYSTEM_PROMPT = (
    "You are an assistant that acts like a person operating a Linux (Debian) machine as root. Your goal is to "
    "carry out the operation the user asks for, or to answer the user's question about the system.\n"
    "In every turn, think about what to do, then call exactly one tool:\n"
    "- bash_action(script): run a bash script in a persistent shell and see its output. The script must not "
    "read input. Long output is truncated: print only what you need.\n"
    "- answer_action(answer): when you know the answer, give only the answer itself.\n"
    "- finish_action(thought): when you have completed a requested operation.\n"
    "You have at most {max_rounds} turns."
)

TRUNCATION_NOTE = "\n[truncated because the output is too long]"
EMPTY_OUTPUT = "The output of the OS is empty."
# Init, example and check scripts are the data's, not the agent's: generous, but never endless.
SCRIPT_TIMEOUT_S = 120
# What is kept of an init, example or check script's output (the rest is not even read).
SCRIPT_OUTPUT_BYTES = 1 << 20


class OSSession(ToolSession):
    tools = TOOLS
    no_call_hint = "the message has no tool call; call bash_action, answer_action or finish_action"

    def __init__(self, task: OSTask, item: OSItem) -> None:
        self.task, self.item = task, item
        self.container = None
        self.shell: PersistentShell | None = None
        self.max_rounds = task.max_rounds
        self.commands = self.timeouts = 0
        self.command_seconds = 0.0
        self.start_seconds = self.handover_seconds = 0.0

    def step_metrics(self) -> dict[str, Any]:
        return self._metrics()

    def _metrics(self, score: float = 0.0, **extra: Any) -> dict[str, Any]:
        return {"score": score, "rounds": self.rounds, "commands": self.commands, "timeouts": self.timeouts,
                "command_seconds": round(self.command_seconds, 3), "start_seconds": round(self.start_seconds, 3),
                "handover_seconds": round(self.handover_seconds, 4), **extra}

    async def reset(self) -> StepResult:
        t0 = time.monotonic()
        image = await self.task.image(self.item.flavour)
        # The agent's login shell comes open with the container (the pool opens it): upstream opens it first, so
        # what an init writes for shells (~/.bashrc) takes effect when the agent sources it, not at login.
        lease = await self.task.pool.acquire(image)
        self.container, self.shell = lease.container, lease.ready
        self.handover_seconds = time.monotonic() - t0
        for number, script in enumerate(self.item.init):
            result = await self.task.call(self._exec, script)
            if result.exit_code != 0:
                reason = (f"init script {number} exited with {result.exit_code}: "
                          f"{result.output[-300:].decode(errors='replace').strip()}")
                logger.warning("os item cannot be prepared, task error: %s", reason)
                return StepResult(status=SampleStatus.TASK_ERROR, metrics=self._metrics(init_error=reason))
        if self.item.start is not None:
            await self.task.call(self.shell.run, self.item.start, timeout=self.task.command_timeout, raw=True)
        self.start_seconds = time.monotonic() - t0
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT.format(max_rounds=self.task.max_rounds)},
            {"role": "user", "content": self.item.description},
        ]
        return StepResult(messages=messages, tools=TOOLS, metrics=self._metrics())

    async def tool_bash_action(self, call: ToolCall) -> str | StepResult:
        try:
            output = await self._bash(str(call.arguments["script"]))
        except ShellBroken as e:
            logger.info("session sandbox broken: %s", e)
            reply = tool_reply(call, "[the machine stopped responding after this command; the task is over]")
            return StepResult([reply], SampleStatus.AGENT_INVALID_ACTION, 0.0, self._metrics(sandbox_broken=1))
        if await self.task.call(self.task.pool.over_disk_limit, self.container):
            reply = tool_reply(call, output + f"\n[the machine's disk limit ({self.task.limits.disk}) is exceeded; "
                                              "the task is over]")
            return StepResult([reply], SampleStatus.AGENT_INVALID_ACTION, 0.0, self._metrics(disk_exceeded=1))
        return output

    async def tool_answer_action(self, call: ToolCall) -> StepResult:
        return await self._finish(str(call.arguments["answer"]))

    async def tool_finish_action(self, call: ToolCall) -> StepResult:
        return await self._finish("")

    async def _finish(self, answer: str) -> StepResult:
        reward, check_error = await self._score(answer)
        extra = {"check_error": check_error} if check_error else {}
        return StepResult([], SampleStatus.COMPLETED, reward, self._metrics(reward, **extra))

    async def close(self) -> None:
        if self.shell is not None:
            self.shell.close()
        if self.container is not None:
            await self.task.pool.release(self.container)

    # ---- internals -----------------------------------------------------------------------------------

    async def _bash(self, script: str) -> str:
        try:
            result: CommandResult = await self.task.call(self.shell.run, script, timeout=self.task.command_timeout)
        except ShellBroken:  # nothing could stop the command (a paused container refuses the kill's exec, too)
            await self._lost_unless_running("could not be stopped")
            raise
        self.commands += 1
        self.command_seconds += result.seconds
        self.timeouts += int(result.timed_out)
        if result.timed_out:
            await self._lost_unless_running(f"got no answer for {self.task.command_timeout:g} s")
        return format_output(result, self.task.output_limit, self.task.command_timeout)

    async def _lost_unless_running(self, what: str) -> None:
        """A command may fail by the agent's doing, or because the container stopped running it (paused, frozen by
        its host, gone): the second is the environment's loss, not the agent's.

        Raises:
            EnvironmentLost: The container is not running.
        """
        state = await self.task.call(self._container_state)
        if state != "running":
            raise EnvironmentLost(f"the session's container {self.container.short_id} is {state}: its command {what}")

    def _container_state(self) -> str:
        try:
            return self.task.client.api.inspect_container(self.container.id)["State"]["Status"]
        except docker.errors.NotFound:
            return "removed"

    def _exec(self, script: Script, *args: str) -> ProcessResult:
        """Run ``script`` in a fresh process of the container (not in the agent's shell), as upstream does."""
        if script.language == "bash":
            argv = ["bash", "-c", script.code, "--", *args]
        else:  # python (items.LANGUAGES)
            argv = ["python3", "-c", script.code, *args]
        return exec_bounded(self.task.client.api, self.container.id, argv, keep_bytes=SCRIPT_OUTPUT_BYTES,
                            timeout=SCRIPT_TIMEOUT_S)

    async def _score(self, answer: str) -> tuple[float, str | None]:
        """(reward, why the check chain could not run or None)."""
        if self.item.match is not None or self.item.regex is not None:
            # Upstream: the answer is stripped (plain-string match), the expected text is not.
            answer = answer.strip() if self.item.strip else answer
            if self.item.match is not None:
                return float(answer == self.item.match), None
            return float(re.search(self.item.regex, answer) is not None), None
        params = [answer]
        for check in self.item.checks:
            script = self.item.example if check is None else check
            try:
                result = await self.task.call(self._exec, script, *params)
            except docker.errors.APIError as e:
                # The container is gone or cannot start a process (the agent broke it): no pass.
                return 0.0, f"check script could not run: {e}"
            if result.exit_code != 0:
                return 0.0, None
            params.append(result.output.decode(errors="replace"))
        return 1.0, None


def format_output(result: CommandResult, limit: int, timeout: float) -> str:
    """The tool reply for a command: its output cut at ``limit`` characters, plus what happened to it."""
    text = result.output
    if len(text) > limit or result.truncated:
        text = text[: max(limit - len(TRUNCATION_NOTE), 0)] + TRUNCATION_NOTE
    notes = []
    if result.timed_out:
        notes.append(f"[the command ran longer than {timeout:g} s and was killed]")
    if result.flooded:
        notes.append("[the command printed too much output and was killed]")
    if result.restarted:
        notes.append("[the shell was restarted: working directory and variables are back to their defaults]")
    text = "\n".join(([text] if text else []) + notes)
    return text or EMPTY_OUTPUT


@register_task("os")
class OSTask(Task):
    """AgentBench OS interaction in Docker containers.

    Args:
        split: Vendored data: ``dev`` (26 items) or ``train`` (1000 items); indices are positions in the file.
        data: Upstream-format data instead of ``split``: a ``.json``/``.jsonl`` file or a folder of them (see
            :func:`~.items.load_items`), or upstream's ``data_config.files`` list of ``{problem_file, script_dir}``
            (:func:`~.items.load_sources`; the seven folders of upstream's ``os-std``); indices are positions over
            the files in that order.
        scripts: Folder that the data's ``{"file": ...}`` references resolve against (upstream's
            ``script_dir``); default: the folder of ``data`` (of a list: its first entry's ``script_dir``).
            ``custom_task`` items resolve against it too (with the vendored splits: their own scripts folder).
        max_rounds: Assistant messages per session.
        command_timeout: Seconds one ``bash_action`` may run before it is killed.
        output_limit: Characters of command output shown to the agent.
        pool_size: Pre-started containers kept per image (0: start on demand).
        memory: Memory limit per container (Docker units, swap included; upstream's: 1 GiB).
        cpus: CPU quota per container, in cores (upstream's: 2).
        pids: Process limit per container.
        network: Docker network mode of the containers: ``none`` (default), loopback only; another mode (``bridge``,
            the daemon's default network) is an opt-in for trusted set-ups that reproduce upstream's numbers on the
            items that install packages (the agent's commands then reach the network; logged as a warning).
        disk: Writable space per container (Docker units; ``None``: unbounded): a write past it fails where the
            Docker daemon can bound it; elsewhere no file may grow past it, and a session whose container holds
            more ends after that command (see :class:`~env_adapters.sandbox.containers.Limits`).
        nofile: Open-file limit inside the containers (``None``: the Docker daemon's).
        reap_interval: Seconds between reaper runs (removes containers of ended sessions and dead workers).
        threads: Threads for blocking Docker calls (at least the worker's concurrency).
    """

    needs_docker = True

    def __init__(self, split: str = "dev", data: str | list[dict[str, str]] | None = None, scripts: str | None = None,
                 max_rounds: int = 8, command_timeout: float = 30.0, output_limit: int = 800, pool_size: int = 2,
                 memory: str = "1g",
                 cpus: float = 2.0, pids: int = 256, network: str = "none", disk: str | None = "2g",
                 nofile: int | None = None, reap_interval: float = 60.0, threads: int = 64) -> None:
        if max_rounds < 1 or command_timeout <= 0 or output_limit < 1:
            raise ValueError(f"os: need max_rounds >= 1, command_timeout > 0, output_limit >= 1; got "
                             f"{max_rounds}, {command_timeout}, {output_limit}")
        self.split = split
        if data is None:
            self.items, self.scripts = load_split(split), VENDORED_SCRIPTS
        elif isinstance(data, list):
            self.items = load_sources(data)
            first = data[0]
            self.scripts = scripts_folder(first["problem_file"], scripts or first.get("script_dir"))
        else:
            self.items, self.scripts = load_items(data, scripts), scripts_folder(data, scripts)
        self.max_rounds, self.command_timeout, self.output_limit = int(max_rounds), float(command_timeout), int(
            output_limit)
        self.limits = Limits(network=network, memory=memory, cpus=float(cpus), pids=int(pids), disk=disk,
                             nofile=None if nofile is None else int(nofile))
        if network != "none":
            logger.warning("os: task containers on Docker network %r: the agent's commands reach the network (an "
                           "opt-in for trusted set-ups; network: none keeps them on loopback)", network)
        self.pool_size, self.reap_interval = int(pool_size), float(reap_interval)
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="os-task")
        self._images: dict[str, str] = {}
        self._image_lock = asyncio.Lock()
        self.client: docker.DockerClient | None = None
        self.pool: ContainerPool | None = None

    def indices(self) -> list[Index]:
        return list(range(len(self.items)))

    async def setup(self) -> None:
        try:
            self.client = await self.call(docker.from_env)
        except docker.errors.DockerException as e:
            # On a Ray cluster the stack places `os` replicas by a custom resource that only nodes running a daemon
            # should offer: a replica landing here means the cluster declared it on the wrong node.
            raise TaskError(
                f"os: no Docker daemon answers on this host ({e}). Start one (bash scripts/setup.sh does), or on a Ray "
                f"cluster declare the resource that places os replicas (e.g. ray start --resources "
                f"'{{\"{DOCKER_RESOURCE}\": 64}}') only on nodes whose daemon answers") from e
        self.pool = ContainerPool(self.client, limits=self.limits, size=self.pool_size, prepare=self._open_shell,
                                  reap_interval=self.reap_interval)
        await self.pool.start()
        self.pool.warm(await self.image("default"))

    def _open_shell(self, container: Any) -> PersistentShell:
        """The agent's login shell in a new container: the pool opens it before a session takes the container."""
        return PersistentShell(self.client.api, container.id)

    async def teardown(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> OSSession:
        if self.pool is None:
            raise TaskError("OSTask.setup() has not run; the worker calls it at start (call it yourself when "
                            "using the task without a worker)")
        if index == -1 and custom_task is not None:
            try:
                item = parse_item(custom_task, "custom_task", self.scripts)
            except (KeyError, ValueError) as e:
                raise TaskError(f"os custom_task is not a valid OS-interaction item: {e}") from e
        elif isinstance(index, int) and 0 <= index < len(self.items):
            item = self.items[index]
        else:
            raise TaskError(f"os index must be in 0..{len(self.items) - 1} (or -1 with a custom_task), got {index!r}")
        return OSSession(self, item)

    async def image(self, flavour: str) -> str:
        """Tag of the image of ``flavour``, built on first use if missing."""
        if flavour not in self._images:
            async with self._image_lock:
                if flavour not in self._images:
                    self._images[flavour] = await self.call(ensure_image, self.client, FLAVOUR_IMAGES[flavour])
        return self._images[flavour]

    async def call(self, fn, *args: Any, **kwargs: Any) -> Any:
        """Run blocking ``fn`` on the task's threads (Docker calls and shell reads block)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args, **kwargs))

