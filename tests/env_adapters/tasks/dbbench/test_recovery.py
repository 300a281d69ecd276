"""DBBench when its own MariaDB server dies: the sessions it cuts off end with ``task error`` (never as the agent's
mistake), the dead server is reaped and restarted on the same port, and new sessions wait for it; a server that
is down makes the task report itself unhealthy."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from env_adapters.protocol import SampleStatus
from env_adapters.sandbox.mariadb import MariaDBServer, mariadb_available
from env_adapters.task import TaskError, get_task_class
from env_adapters.tasks.dbbench.items import load_items

pytestmark = [pytest.mark.slow, pytest.mark.mysql]

UPDATE_ITEM = 40
HANG_GUARD = 120  # seconds; only there so that a regression fails instead of hanging


@pytest.fixture
def mariadb_installed():
    if not mariadb_available():
        pytest.skip("MariaDB is not installed (apt-get install -y mariadb-server)")


@pytest.fixture
async def task(mariadb_installed):
    task = get_task_class("db")(backend="mysql", statement_timeout=1.0)
    await task.setup()
    yield task
    await task.teardown()


async def started(task, index):
    session = await task.start_session(index)
    await session.reset()
    return session


def reaped(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()


async def test_dead_server_ends_its_sessions_as_task_errors_and_comes_back(task, tool_call):
    server = task.server
    url, pid = server.url, server.pid
    before = await started(task, 3)  # notices the death in a statement
    scoring = await started(task, UPDATE_ITEM)  # notices it when scored
    os.kill(pid, signal.SIGKILL)
    # Starts while the server is down (a restart takes seconds): waits for it.
    after = await asyncio.wait_for(started(task, UPDATE_ITEM), HANG_GUARD)
    try:
        with pytest.raises(TaskError, match="server died"):
            await before.step(tool_call("execute_sql", query="SELECT 1"))
        with pytest.raises(TaskError, match="server died"):
            await scoring.step(tool_call("commit_final_answer", answers=["done"]))
        assert reaped(pid), "the dead server was left a zombie"
        assert server.url == url and server.running
        assert await task.healthy()
        reply = await after.step(tool_call("execute_sql", query=load_items()[UPDATE_ITEM]["label"][0]))
        assert reply.messages[0]["content"] == "[]"
        done = await after.step(tool_call("commit_final_answer", answers=["done"]))
        assert (done.status, done.reward) == (SampleStatus.COMPLETED, 1.0)
    finally:
        await before.close()
        await scoring.close()
        await after.close()
    assert await task.backend.leftovers() == []


async def test_sessions_closed_while_the_server_is_stopped_cost_one_try_each_and_leave_nothing(mariadb_installed,
                                                                                                monkeypatch):
    # A stopped (SIGSTOP) server holds its connections open and answers nothing. Each closing session tries its own
    # drop once, then leaves it and the earlier ones to the next drop instead of trying each again (every try waits
    # admin_timeout); the first drop after the server goes on removes them all.
    task = get_task_class("db")(backend="mysql", statement_timeout=1.0, admin_timeout=1.0)
    await task.setup()
    tried: list[str] = []
    drop = task.backend._drop
    monkeypatch.setattr(task.backend, "_drop", lambda name: (tried.append(name), drop(name))[1])
    try:
        first, second = await started(task, 3), await started(task, 4)
        names = [first.db.name, second.db.name]
        os.kill(task.server.pid, signal.SIGSTOP)
        try:
            await asyncio.wait_for(first.close(), HANG_GUARD)
            await asyncio.wait_for(second.close(), HANG_GUARD)
        finally:
            os.kill(task.server.pid, signal.SIGCONT)
        assert tried == names  # the second close did not try the first's again
        third = await started(task, 6)
        third_name = third.db.name
        await third.close()
        assert tried[2:] == [third_name, *sorted(names)]
        assert await task.backend.leftovers() == []
    finally:
        await task.teardown()


async def test_external_server_down_makes_the_task_unhealthy_until_it_answers(mariadb_installed):
    with MariaDBServer() as server:  # given by URL: to the task, an external server it cannot restart
        external = get_task_class("db")(backend="mysql", mysql_url=server.url)
        await external.setup()
        try:
            assert await external.healthy()
            pid = server.pid
            os.kill(pid, signal.SIGKILL)
            assert reaped(pid)
            assert not await asyncio.wait_for(external.healthy(), HANG_GUARD)
            with pytest.raises(TaskError, match="cannot reach"):
                await external.open_database([])
            server.relaunch()  # the server comes back on its port
            await asyncio.to_thread(server.wait_ready)
            assert await asyncio.wait_for(external.healthy(), HANG_GUARD)
        finally:
            await external.teardown()


class DyingServer:
    """A server killed a moment ago: it looks alive for ``polls`` more checks (its exit not yet reaped), then dead."""

    def __init__(self, polls: int) -> None:
        self.polls, self.relaunched, self.port, self.pid = polls, 0, 1, 1

    @property
    def running(self) -> bool:
        self.polls -= 1
        return self.polls >= 0 and not self.relaunched

    def relaunch(self) -> None:
        self.relaunched += 1

    def wait_ready(self) -> None:
        pass


@pytest.mark.parametrize("polls", [0, 3])
async def test_a_killed_server_whose_exit_is_not_seen_yet_is_restarted(polls):
    # A session meeting a refused connection before the server's exit is reaped must not take the server for alive
    # (the second try would be refused too and the session would fail instead of waiting for the restart).
    task = get_task_class("db")(backend="sqlite")
    task.server = DyingServer(polls)
    assert await task._restart_server() is True
    assert task.server.relaunched == 1 and task.server_starts == 1
