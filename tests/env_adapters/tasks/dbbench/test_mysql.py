"""DBBench on a MariaDB server: isolation of sessions, statement limits, and clean-up (task called directly)."""

from __future__ import annotations

import asyncio

import pytest

from env_adapters.protocol import SampleStatus
from env_adapters.task import TaskError

pytestmark = [pytest.mark.slow, pytest.mark.mysql]


@pytest.fixture
def task(mysql_task):
    return mysql_task


async def test_hostile_sql_stays_inside_its_session(task, tool_call):
    victim = await task.start_session(3)
    attacker = await task.start_session(3)
    await victim.reset()
    await attacker.reset()
    try:
        async def run(sql):
            reply = await attacker.step(tool_call("execute_sql", query=sql))
            assert reply.status is SampleStatus.RUNNING
            return reply.messages[0]["content"]

        assert "Access denied" in await run(f"DROP DATABASE `{victim.db.name}`")
        assert "Access denied" in await run("SET GLOBAL max_connections = 1")
        assert "Access denied" in await run("CREATE DATABASE other")
        assert "timed out after 1 s" in await run("SELECT SLEEP(1000)")
        # The agent may lift its own session limit; the watchdog still kills the statement.
        await run("SET SESSION max_statement_time = 0")
        assert "timed out after 1 s" in await run("SELECT SLEEP(1000)")
        assert await run("SELECT 1") == "[(1,)]"
        reply = await victim.step(tool_call("execute_sql", query="SELECT count(*) FROM skyscrapers_in_Columbus"))
        assert reply.messages[0]["content"] != "[(0,)]" and not reply.messages[0]["content"].startswith("Error")
    finally:
        await attacker.close()
        await victim.close()
    assert await task.backend.leftovers() == []


async def test_cancelled_session_drops_its_database_and_query(task, tool_call):
    session = await task.start_session(3)
    await session.reset()
    name = session.db.name
    step = asyncio.ensure_future(session.step(tool_call("execute_sql", query="SELECT SLEEP(30)")))
    await asyncio.sleep(0.3)
    step.cancel()  # what the worker does on a cancel, before it closes the session
    await asyncio.wait([step])
    await session.close()
    assert await task.backend.leftovers() == []
    running = await task.backend.admin("SELECT count(*) FROM information_schema.processlist WHERE user = %s",
                                       (name,))
    assert running == [(0,)]
    assert task.backend.open_databases == 0


async def test_hash_scored_item_is_scored_by_the_server(task, tool_call):
    session = await task.start_session(40)
    await session.reset()
    try:
        # Committing without the update leaves the table as it was: wrong.
        done = await session.step(tool_call("commit_final_answer", answers=["done"]))
        assert (done.status, done.reward) == (SampleStatus.COMPLETED, 0.0)
    finally:
        await session.close()


async def test_item_mysql_cannot_load_is_not_served(task):
    assert 5 not in task.indices() and len(task.indices()) == 59
    with pytest.raises(TaskError, match="empty column name"):
        await task.start_session(5)
