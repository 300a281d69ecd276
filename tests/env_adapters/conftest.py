"""Shared fixtures for environment tests.

``env_stack`` (session scope, subprocesses, the real thing) is what task tests use to run "through the real
controller and worker"::

    @pytest.mark.slow
    async def test_oracle(env_stack):
        stack = env_stack("os", options={"split": "dev"}, concurrency=2)
        async with EnvClient(stack.url) as env:
            started = await env.start_sample("os", 0)
            ...

Stacks are started on first request and shared by every test asking for the same arguments; all stop at the
end of the session (also when tests fail). A test that breaks its stack on purpose (kills a worker) should
build its own ``EnvStack`` instead.

``local_stack`` (function scope, in-process) runs a controller and workers inside the test's event loop,
for fast tests of the controller and worker themselves; ``ProbeTask`` is a task whose behaviour each
assistant message scripts.

``docker_client`` (session scope) is a client of the local Docker daemon; tests asking for it skip without one.
``mariadb_url`` (session scope) is a private MariaDB server's URL; tests asking for it skip where MariaDB is not
installed. ``mariadb_sessions()`` reads what sessions hold on that server: the ``db`` task's session databases and
its session users' connections.

``ray_hosts`` (session scope) is ``netns_hosts.NetnsRayCluster``: ``with ray_hosts(resources) as hosts:`` runs a Ray
cluster over hosts of their own addresses (network namespaces); tests asking for it skip where namespaces cannot be
made (not root).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from env_adapters.controller import Controller, ControllerConfig
from env_adapters.launcher import EnvStack
from env_adapters.protocol import SampleStatus
from env_adapters.sandbox.mariadb import MariaDBServer, mariadb_available
from env_adapters.task import EnvironmentLost, InvalidAction, Session, StepResult, Task, TaskError
from env_adapters.worker import Worker


@pytest.fixture(scope="session")
def docker_client():
    """A client of the local Docker daemon (the test skips where there is none); closed at the end."""
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        pytest.skip(f"no Docker daemon: {e}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def mariadb_url():
    """``mysql://root@127.0.0.1:PORT`` of a private MariaDB server, stopped (and its folder deleted) at the end."""
    if not mariadb_available():
        pytest.skip("MariaDB is not installed (apt-get install -y mariadb-server)")
    with MariaDBServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def mariadb_sessions(mariadb_url) -> Callable[[], tuple[list[str], int]]:
    """``mariadb_sessions()``: the session databases on the ``mariadb_url`` server, and its session users'
    connections."""
    import pymysql

    from env_adapters.tasks.dbbench.backends import DB_PREFIX

    parts = urlsplit(mariadb_url)
    pattern = DB_PREFIX.replace("_", r"\_") + "%"

    def read() -> tuple[list[str], int]:
        conn = pymysql.connect(host=parts.hostname, port=parts.port, user="root")
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
                               (pattern,))
                databases = [r[0] for r in cursor.fetchall()]
                cursor.execute("SELECT count(*) FROM information_schema.processlist WHERE user LIKE %s", (pattern,))
                return databases, cursor.fetchone()[0]
        finally:
            conn.close()

    return read


@pytest.fixture(scope="session")
def ray_hosts() -> type:
    # Loaded by path: this folder is no package.
    spec = importlib.util.spec_from_file_location("netns_hosts", Path(__file__).with_name("netns_hosts.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if reason := module.available():
        pytest.skip(reason)
    return module.NetnsRayCluster


@pytest.fixture(scope="session")
def env_stack():
    """Factory ``env_stack(task, *, options=None, concurrency=4, replicas=1, name=None, controller=None)``
    returning a started :class:`EnvStack` (``.url`` is the controller's base URL)."""
    stacks: dict[str, EnvStack] = {}

    def get(task: str, *, options: dict[str, Any] | None = None, concurrency: int = 4, replicas: int = 1,
            name: str | None = None, controller: dict[str, Any] | None = None) -> EnvStack:
        worker = {"task": task, "name": name, "replicas": replicas, "concurrency": concurrency,
                  "options": options or {}}
        config = {"controller": {"port": 0, **(controller or {})}, "workers": [worker]}
        key = json.dumps(config, sort_keys=True, default=str)
        if key not in stacks:
            stack = EnvStack(config)
            stack.start()  # on failure EnvStack.start stops what it started and raises
            stacks[key] = stack
        return stacks[key]

    yield get
    for stack in stacks.values():
        stack.stop()


# ---- in-process stack for controller/worker tests ------------------------------------------------


class ProbeSession(Session):
    """Each assistant message's ``content`` scripts the step: ``ok``, ``finish``, ``sleep:S``, ``raise``,
    ``invalid``, ``lost`` (the environment lost it), ``silent`` (running without messages)."""

    def __init__(self, task: ProbeTask, index: Any) -> None:
        self.task, self.index = task, index

    async def reset(self) -> StepResult:
        if self.index == "fail-reset":
            raise TaskError("reset failed on purpose")
        return StepResult(messages=[{"role": "user", "content": f"probe {self.index}"}], tools=[])

    async def step(self, message: dict[str, Any]) -> StepResult:
        command = message.get("content") or ""
        if command.startswith("sleep:"):
            await asyncio.sleep(float(command.split(":", 1)[1]))
        elif command == "raise":
            raise RuntimeError("step failed on purpose")
        elif command == "invalid":
            raise InvalidAction("not a valid action")
        elif command == "lost":
            raise EnvironmentLost("the backend stopped answering")
        elif command == "finish":
            return StepResult(messages=[{"role": "user", "content": "done"}], status=SampleStatus.COMPLETED,
                              reward=1.0, metrics={"n": 1})
        elif command == "silent":
            return StepResult(messages=[])
        return StepResult(messages=[{"role": "user", "content": f"echo {command}"}])

    async def close(self) -> None:
        self.task.closed.append(self.index)


class ProbeTask(Task):
    def __init__(self, size: int = 10) -> None:
        self.size = size
        self.closed: list[Any] = []
        self.setup_calls = self.teardown_calls = 0

    def indices(self) -> list[Any]:
        return [*range(self.size), "fail-reset"]

    async def start_session(self, index: Any, custom_task: dict[str, Any] | None = None) -> Session:
        return ProbeSession(self, index)

    async def setup(self) -> None:
        self.setup_calls += 1

    async def teardown(self) -> None:
        self.teardown_calls += 1


@pytest.fixture
def probe_task() -> ProbeTask:
    """A fresh :class:`ProbeTask` (tests cannot import conftest under importlib mode)."""
    return ProbeTask()


@dataclass
class LocalStack:
    controller: Controller
    url: str
    workers: list[Worker] = field(default_factory=list)

    async def add_worker(self, task: Task | None = None, *, name: str = "probe", concurrency: int = 2,
                         heartbeat_interval: float = 0.1, token: str | None = None, **options: Any) -> Worker:
        worker = Worker(task or ProbeTask(), name=name, concurrency=concurrency, controller_url=self.url,
                        heartbeat_interval=heartbeat_interval, token=token or self.controller.token, **options)
        await worker.start()
        self.workers.append(worker)
        for _ in range(100):  # registered on its first heartbeat
            if any(w.address == worker.address and w.alive for w in self.controller.workers.values()):
                return worker
            await asyncio.sleep(0.01)
        raise AssertionError(f"worker {worker.address} did not register")


@pytest.fixture
async def local_stack():
    """Factory ``await local_stack(workers=1, concurrency=2, token=None, **ControllerConfig fields)``."""
    stacks: list[LocalStack] = []

    async def make(workers: int = 1, concurrency: int = 2, token: str | None = None, **config: Any) -> LocalStack:
        controller = Controller(ControllerConfig(**config), token=token)
        stack = LocalStack(controller, await controller.start("127.0.0.1", 0))
        stacks.append(stack)
        for _ in range(workers):
            await stack.add_worker(concurrency=concurrency)
        return stack

    yield make
    for stack in stacks:
        for worker in stack.workers:
            await worker.stop()
        await stack.controller.stop()
