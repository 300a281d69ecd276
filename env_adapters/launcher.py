"""``agentrl-env up CONFIG``: a controller and its workers from one YAML, stopped together.

Config::

    controller: {host: 127.0.0.1, port: 5020, token: null, session_idle_timeout: 300, ...}  # ControllerConfig keys
    workers:
      - {task: calc, name: calc, replicas: 2, concurrency: 64, threads: 8, options: {seed: 0},
         ray: {num_cpus: 0, resources: {}, max_restarts: 3}}  # placement, read with --ray only
    openenv: {host: 127.0.0.1, port: 8010}  # optional: the tasks as an OpenEnv environment too (openenv_serve)

A text value may name environment variables as ``${NAME}`` (data paths, endpoints: the recipe's upstream-data
stack); a variable that is not set stops the load, naming it and the key that uses it.

Off loopback the controller needs a token: ``token``, or ``token_file`` (a file holding it, made with a random token
when it does not exist; the training side reads it with ``agentrl.env.token_file``), or, on a trusted network only,
``allow_no_token: true``.

Each process is a subprocess (``python -m env_adapters.cli controller|worker ...``), or with ``--ray [ADDRESS]`` a
process owned by a Ray actor, placed over the cluster by each worker's ``ray`` entry
(:mod:`env_adapters.ray_stack`); :class:`EnvStack` is the same thing as a context manager for tests and demos::

    with EnvStack({"workers": [{"task": "calc"}]}) as stack:
        client = EnvClient(stack.url)
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from env_adapters.controller import DEFAULT_PORT, ControllerConfig
from env_adapters.http import TOKEN_ENV, ensure_token_file
from env_adapters.sandbox.servers import term_with_parent
from env_adapters.worker import DEFAULT_HEARTBEAT_INTERVAL

logger = logging.getLogger(__name__)

STOP_GRACE_S = 10.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ControllerSpec(BaseModel):
    # Besides these, the timeouts and limits of ControllerConfig (checked in load_config).
    model_config = ConfigDict(extra="allow")

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    token_file: str | None = None  # read, or made with a random token where it does not exist
    allow_no_token: bool = False  # listen off loopback without a token (trusted networks only)

    @model_validator(mode="after")
    def _one_token_source(self) -> ControllerSpec:
        if self.token and self.token_file:
            raise ValueError("set controller.token or controller.token_file, not both")
        return self


class RayPlacement(_Strict):
    """Where a worker entry's replicas may run on a Ray cluster (``agentrl-env up --ray``; ignored without it)."""

    num_cpus: float = Field(0, ge=0)  # reserved per replica; 0 leaves the cores to the training run's actors
    memory: int | None = Field(None, ge=0)  # bytes reserved per replica
    resources: dict[str, float] = Field(default_factory=dict)  # custom resources a node must offer, e.g. {docker: 1}
    max_restarts: int = Field(3, ge=-1)  # how often Ray starts a dead replica again (-1: always)


class WorkerSpec(_Strict):
    task: str
    name: str | None = None
    replicas: int = Field(1, ge=1)
    concurrency: int = Field(32, ge=1)
    threads: int | None = Field(None, ge=1)  # for blocking task code; default: the concurrency
    options: dict[str, Any] = Field(default_factory=dict)
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    ray: RayPlacement = Field(default_factory=RayPlacement)


class OpenEnvSpec(_Strict):
    """The stack's tasks served as an OpenEnv environment too (:mod:`env_adapters.openenv_serve`)."""

    host: str = "127.0.0.1"  # off loopback only with the controller's token, which it requires too
    port: int = Field(8010, ge=0)  # 0: any free port


class StackConfig(_Strict):
    controller: ControllerSpec = Field(default_factory=ControllerSpec)
    workers: list[WorkerSpec] = Field(default_factory=list)
    openenv: OpenEnvSpec | None = None


_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_environment(value: Any, source: str, key: str = "") -> Any:
    """``value`` with every ``${NAME}`` in its texts replaced by the environment variable ``NAME``.

    Raises:
        ValueError: a variable is not set (the message names it, the key and ``source``).
    """
    if isinstance(value, dict):
        return {k: expand_environment(v, source, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_environment(v, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ValueError(f"stack config {source}: {key} uses ${{{name}}}, which is not set: export {name}=... "
                             "(see the comments at the top of the file)")
        return os.environ[name]

    return _ENV_REFERENCE.sub(lookup, value)


def load_config(config: dict[str, Any] | str | Path) -> StackConfig:
    """Validate a stack config (a dict or a YAML path; ``${NAME}`` from the environment); errors name the bad key."""
    source = "config"
    if not isinstance(config, dict):
        source = str(config)
        config = yaml.safe_load(Path(config).read_text()) or {}
    config = expand_environment(config, source)
    try:
        parsed = StackConfig.model_validate(config)
    except ValidationError as e:
        raise ValueError(f"invalid stack config {source}:\n{e}") from e
    known = {f.name for f in fields(ControllerConfig)}
    unknown = sorted(set(parsed.controller.model_extra or {}) - known)
    if unknown:
        raise ValueError(f"invalid stack config {source}: unknown controller key(s) {unknown}; known: "
                         f"host, port, token, token_file, allow_no_token, {', '.join(sorted(known))}")
    return parsed


class StackStartError(RuntimeError):
    """A process of the stack did not come up; the message says which and why."""


def child_env(token_env: dict[str, str]) -> dict[str, str]:
    """This process's environment for a stack process, with the stack's token (``token_env``) and no other: a
    ``$AGENTRL_ENV_TOKEN`` of the caller's shell never reaches a stack that has none."""
    return {**{k: v for k, v in os.environ.items() if k != TOKEN_ENV}, **token_env}


def remove_killed_containers() -> None:
    """Remove the sandbox containers of stack processes that had to be SIGKILLed (a worker whose pool outlived the
    stop's grace period leaves them): every container whose owner on this host no longer runs. No Docker, nothing
    to do."""
    # Imported here: the Docker SDK is a quarter of this module's import time, and only this rare path needs it.
    from env_adapters.sandbox.containers import docker_available, remove_orphans

    if docker_available():
        removed = remove_orphans()
        if removed:
            logger.info("removed %d container(s) of killed processes", len(removed))


class EnvStack:
    """Start a controller and workers as subprocesses; stop them all on exit (also on exceptions).

    The processes get SIGTERM from the kernel when the thread that started them ends, also when this process is
    killed: start a stack from a thread that lives as long as the stack (the main one, as ``up`` does).

    Args:
        config: A stack config dict or the path of a YAML file (see the module docstring).
        startup_timeout: Seconds to wait for the controller and every worker to register.
        log_dir: Where the processes' output goes (``NAME.log``); ``None``: a temporary folder, removed on
            stop. Use ``inherit=True`` to let them write to this process's stdout/stderr instead.
        inherit: Pass the processes' output through (for the ``up`` command).
        command: How to run ``agentrl-env`` (default: this Python's ``-m env_adapters.cli``).

    Attributes:
        url: The controller's base URL, once started.
        openenv_url: The OpenEnv server's base URL where the config has an ``openenv`` entry, once started.
    """

    def __init__(self, config: dict[str, Any] | str | Path, *, startup_timeout: float = 60.0,
                 log_dir: str | Path | None = None, inherit: bool = False, command: list[str] | None = None) -> None:
        self.config = load_config(config)
        self.command = command or [sys.executable, "-m", "env_adapters.cli"]
        self.startup_timeout, self.inherit = startup_timeout, inherit
        self._tmp = None if log_dir or inherit else tempfile.TemporaryDirectory(prefix="agentrl-env-")
        self.log_dir = Path(log_dir or (self._tmp.name if self._tmp else tempfile.gettempdir()))
        self.url: str | None = None
        self.openenv_url: str | None = None
        self.controller: subprocess.Popen | None = None
        self.openenv: subprocess.Popen | None = None
        self.workers: list[tuple[str, subprocess.Popen]] = []  # (label, process)
        self._worker_cmds: list[tuple[list[str], RayPlacement]] = []  # how worker i was started
        spec = self.config.controller
        self.token = ensure_token_file(spec.token_file) if spec.token_file else spec.token

    # ---- processes ------------------------------------------------------------------------------

    def _spawn(self, label: str, args: list[str], placement: RayPlacement | None = None) -> subprocess.Popen:
        """Start ``agentrl-env ARGS`` as process ``label`` (``placement`` is for launchers that place processes)."""
        cmd, env = [*self.command, *args], child_env(self._token_env())
        # SIGTERM (the tasks tear down) when the thread that starts it ends, also when this process is SIGKILLed.
        if self.inherit:
            return subprocess.Popen(cmd, env=env, preexec_fn=term_with_parent)
        with open(self.log_dir / f"{label}.log", "ab") as log:
            return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=term_with_parent)

    def _tail(self, label: str, lines: int = 15) -> str:
        path = self.log_dir / f"{label}.log"
        if self.inherit or not path.exists():
            return "(see its output above)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _token_env(self) -> dict[str, str]:
        """The token for the stack's processes: through their environment, never on a command line (``ps``)."""
        return {TOKEN_ENV: self.token} if self.token else {}

    def _worker_args(self) -> list[str]:
        """Arguments every worker gets besides its entry's (where it binds)."""
        return []

    def _controller_args(self, url_file: Path, port: int | None = None) -> list[str]:
        spec = self.config.controller
        port = spec.port if port is None else port
        args = ["controller", "--host", spec.host, "--port", str(port), "--url-file", str(url_file),
                *(["--allow-no-token"] if spec.allow_no_token else [])]
        for key, value in (spec.model_extra or {}).items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        return args

    def start(self) -> str:
        """Start everything and wait until all workers registered; return the controller URL."""
        try:
            self._start_controller()
            self._start_workers()
            if self.config.openenv is not None:
                self._start_openenv()
        except BaseException:
            self.stop()
            raise
        logger.info("environment stack up at %s (%d worker processes; logs in %s)", self.url, len(self.workers),
                    "the terminal" if self.inherit else self.log_dir)
        return self.url

    def _start_controller(self, port: int | None = None) -> None:
        url_file = self.log_dir / f"controller-url-{os.getpid()}-{id(self)}"
        url_file.unlink(missing_ok=True)
        self.controller = self._spawn("controller", self._controller_args(url_file, port))
        self.url = self._wait_url("controller", self.controller, url_file)

    def _start_openenv(self) -> None:
        spec = self.config.openenv
        url_file = self.log_dir / f"openenv-url-{os.getpid()}-{id(self)}"
        url_file.unlink(missing_ok=True)
        self.openenv = self._spawn("openenv", ["openenv", "--controller", self.url, "--host", spec.host, "--port",
                                               str(spec.port), "--url-file", str(url_file)])
        self.openenv_url = self._wait_url("openenv", self.openenv, url_file)

    def _wait_url(self, label: str, proc: subprocess.Popen, url_file: Path) -> str:
        """The URL that process ``label`` writes to ``url_file`` once it listens."""
        deadline = time.monotonic() + self.startup_timeout
        while not url_file.exists() or not url_file.read_text():
            if proc.poll() is not None:
                raise StackStartError(f"{label} exited with code {proc.returncode}:\n{self._tail(label)}")
            if time.monotonic() > deadline:
                raise StackStartError(f"{label} did not start within {self.startup_timeout}s")
            time.sleep(0.05)
        url = url_file.read_text()
        url_file.unlink()
        return url

    def _start_workers(self) -> None:
        for i, spec in enumerate(self.config.workers):
            # Inline (JSON is YAML), so that a worker on any host reads them.
            options = [arg for key, value in spec.options.items() for arg in ("--option", f"{key}={json.dumps(value)}")]
            for r in range(spec.replicas):
                label = f"worker{i}.{r}-{spec.name or spec.task}"
                cmd = ["worker", "--task", spec.task, "--name", spec.name or spec.task, "--controller", self.url,
                       "--concurrency", str(spec.concurrency), *options,
                       "--heartbeat-interval", str(spec.heartbeat_interval), *self._worker_args()]
                if spec.threads is not None:
                    cmd += ["--threads", str(spec.threads)]
                self._worker_cmds.append((cmd, spec.ray))
                self.workers.append((label, self._spawn(label, cmd, spec.ray)))
        self.wait_registered(len(self.workers))

    def alive_workers(self) -> int:
        """Number of workers the controller currently considers alive."""
        return sum(w["alive"] for task in self._get("list_workers").values() for w in task.values())

    def wait_registered(self, count: int, timeout: float | None = None) -> None:
        """Wait until the controller lists ``count`` alive workers; fail early if a worker process exits."""
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        while True:
            for label, proc in self.workers:
                if proc.poll() is not None:
                    raise StackStartError(f"worker {label} exited with code {proc.returncode}:\n{self._tail(label)}")
            if self.alive_workers() >= count:
                return
            if time.monotonic() > deadline:
                raise StackStartError(f"only {self.alive_workers()} of {count} workers registered within "
                                      f"{timeout or self.startup_timeout}s; see the logs in {self.log_dir}")
            time.sleep(0.05)

    def _get(self, route: str) -> Any:
        request = urllib.request.Request(f"{self.url}/api/{route}")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=5) as resp:
            return json.loads(resp.read())

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker process ``i`` (fault injection)."""
        proc = self.workers[i][1]
        proc.kill()
        proc.wait()

    def kill_controller(self) -> None:
        """SIGKILL the controller (fault injection): it forgets every session; the workers keep heartbeating."""
        self.controller.kill()
        self.controller.wait()

    def restart_controller(self) -> None:
        """Start the controller again on its port after it stopped; the workers re-register by heartbeat."""
        if self.controller.poll() is None:
            raise RuntimeError("the controller is still running; kill it first")
        self._start_controller(port=int(self.url.rsplit(":", 1)[1]))

    def restart_worker(self, i: int) -> None:
        """Start worker process ``i`` again (same command, new port) after it stopped."""
        label, proc = self.workers[i]
        if proc.poll() is None:
            raise RuntimeError(f"worker {label} is still running; stop or kill it first")
        self.workers[i] = (label, self._spawn(label, *self._worker_cmds[i]))

    def stop(self) -> None:
        """SIGTERM the OpenEnv server and the workers (so tasks tear down), then the controller; SIGKILL what outlives
        the grace period."""
        killed = False
        first = [p for _, p in self.workers] + ([self.openenv] if self.openenv else [])
        for procs in (first, [self.controller] if self.controller else []):
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.warning("process %d did not stop within %.0fs; killing it", proc.pid, STOP_GRACE_S)
                    proc.kill()
                    proc.wait()
                    killed = True
        if killed:
            remove_killed_containers()
        self.workers, self.controller, self.openenv = [], None, None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EnvStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
