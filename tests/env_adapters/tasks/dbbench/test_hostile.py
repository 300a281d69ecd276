"""DBBench on MariaDB against hostile agents: whatever one session leaves behind, scoring runs with the agent's own
rights on base tables only, no statement of the backend waits without bound, and results are capped where the
agent cannot reach (task and backend called directly)."""

from __future__ import annotations

import asyncio
import tracemalloc

import pymysql
import pytest

from env_adapters.protocol import SampleStatus
from env_adapters.task import InvalidAction, get_task_class
from env_adapters.tasks.dbbench.backends import MAX_ROWS, MySQLBackend, parse_mysql_url
from env_adapters.tasks.dbbench.items import load_items, tables_of

pytestmark = [pytest.mark.slow, pytest.mark.mysql]

VICTIM_ITEM = 3  # skyscrapers_in_Columbus, 40 rows
UPDATE_ITEM = 40  # hash-scored
VICTIM_TABLE = "skyscrapers_in_Columbus"
HANG_GUARD = 120  # seconds; only there so that a regression fails instead of hanging


@pytest.fixture
def task(mysql_task):
    return mysql_task


async def started(task, index):
    session = await task.start_session(index)
    await session.reset()
    return session


async def sql(session, tool_call, query):
    reply = await session.step(tool_call("execute_sql", query=query))
    assert reply.status is SampleStatus.RUNNING
    return reply.messages[0]["content"]


def as_view_of(table, expression):
    """A view named like ``table``, with its columns, each computing ``expression`` with the reader's rights."""
    columns = ", ".join(f"{expression} AS `{c}`" for c in table.columns)
    return f"CREATE SQL SECURITY INVOKER VIEW `{table.name}` AS SELECT {columns}"


def root(url):
    return pymysql.connect(**parse_mysql_url(url), autocommit=True)


def count_rows(url, database, table):
    conn = root(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM `{database}`.`{table}`")
            return cursor.fetchone()[0]
    finally:
        conn.close()


async def test_scoring_never_runs_agent_code_with_more_rights_than_the_agent(task, tool_call, mariadb_url):
    victim = await started(task, VICTIM_ITEM)
    attacker = await started(task, UPDATE_ITEM)
    try:
        victim_db, attacker_db = victim.db.name, attacker.db.name
        assert "command denied" in await sql(attacker, tool_call, f"DELETE FROM `{victim_db}`.`{VICTIM_TABLE}`")
        # A function that runs with the rights of whoever calls it, behind a view named like the scored table.
        assert await sql(attacker, tool_call, "CREATE TABLE calls (n INT)") == "[]"
        body = f"BEGIN INSERT INTO calls VALUES (1); DELETE FROM `{victim_db}`.`{VICTIM_TABLE}`; RETURN 1; END"
        assert await sql(attacker, tool_call, f"CREATE FUNCTION wipe() RETURNS INT SQL SECURITY INVOKER {body}") == "[]"
        table = attacker.tables[0]
        assert await sql(attacker, tool_call, f"DROP TABLE `{table.name}`") == "[]"
        assert await sql(attacker, tool_call, as_view_of(table, "wipe()")) == "[]"
        done = await attacker.step(tool_call("commit_final_answer", answers=["done"]))
        assert (done.status, done.reward) == (SampleStatus.COMPLETED, 0.0)
        assert count_rows(mariadb_url, victim_db, VICTIM_TABLE) == 40, "scoring ran the agent's function as root"
        assert count_rows(mariadb_url, attacker_db, "calls") == 0, "scoring read the agent's view"
    finally:
        await attacker.close()
        await victim.close()
    assert await task.backend.leftovers() == []


async def test_a_sleeping_view_stalls_no_other_session(task, tool_call):
    attacker = await started(task, UPDATE_ITEM)
    try:
        assert await sql(attacker, tool_call, f"DROP TABLE `{attacker.tables[0].name}`") == "[]"
        assert await sql(attacker, tool_call, as_view_of(attacker.tables[0], "SLEEP(600)")) == "[]"
        scoring = asyncio.ensure_future(attacker.step(tool_call("commit_final_answer", answers=["done"])))
        await asyncio.sleep(0.2)

        async def other_episode():
            victim = await started(task, VICTIM_ITEM)
            try:
                return await sql(victim, tool_call, f"SELECT count(*) FROM {VICTIM_TABLE}")
            finally:
                await victim.close()

        assert await asyncio.wait_for(other_episode(), HANG_GUARD) == "[(40,)]"
        done = await asyncio.wait_for(scoring, HANG_GUARD)
        assert (done.status, done.reward) == (SampleStatus.COMPLETED, 0.0)
    finally:
        await attacker.close()
    assert await task.backend.leftovers() == []


async def test_a_transaction_left_prepared_does_not_block_the_drop(task, tool_call):
    attacker = await started(task, VICTIM_ITEM)
    try:
        for statement in ("XA START 'stuck'", f"UPDATE {VICTIM_TABLE} SET Floors = '0'", "XA END 'stuck'",
                          "XA PREPARE 'stuck'"):
            assert await sql(attacker, tool_call, statement) == "[]"
    finally:
        # The prepared transaction outlives the connection and holds its locks.
        await asyncio.wait_for(attacker.close(), HANG_GUARD)
    assert await task.backend.leftovers() == []
    assert await task.backend.admin("XA RECOVER") == []


@pytest.mark.parametrize(
    ("query", "rows"),
    [("SELECT a.seq, b.seq FROM seq_1_to_1000 a, seq_1_to_1000 b", MAX_ROWS),  # a million rows
     ("SELECT repeat('x', 200000) FROM seq_1_to_1000", 6)],  # 200 MB: stops past MAX_RESULT_CHARS
)
async def test_result_cap_cannot_be_lifted_and_results_stream(mariadb_url, tool_call, query, rows):
    task = get_task_class("db")(backend="mysql", mysql_url=mariadb_url, statement_timeout=60.0)
    await task.setup()
    session = await started(task, VICTIM_ITEM)
    try:
        assert await sql(session, tool_call, "SET SESSION sql_select_limit = DEFAULT") == "[]"
        tracemalloc.start()
        try:
            result = await session.db.execute(query)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(result) == rows
        assert peak < 16 * 2**20, f"fetching held {peak / 2**20:.0f} MiB"
        # The rest of the query was stopped, and the session goes on.
        running = [(1,)]
        for _ in range(100):
            running = await task.backend.admin("SELECT count(*) FROM information_schema.processlist WHERE user = %s "
                                               "AND command = 'Query'", (session.db.name,))
            if running == [(0,)]:
                break
            await asyncio.sleep(0.1)
        assert running == [(0,)]
        assert await sql(session, tool_call, "SELECT 1") == "[(1,)]"
    finally:
        await session.close()
        await task.teardown()


async def test_lone_surrogate_is_the_agents_error(task, tool_call):
    session = await started(task, VICTIM_ITEM)
    try:
        # Rejected where every family parses tool calls: the worker ends the episode ``agent invalid action``.
        with pytest.raises(InvalidAction, match="not valid Unicode"):
            await session.step(tool_call("execute_sql", query="SELECT '\ud800'"))
        assert await sql(session, tool_call, "SELECT 1") == "[(1,)]"  # nothing reached the server
    finally:
        await session.close()


async def test_an_agent_that_kills_its_own_connection_harms_only_itself(task, tool_call):
    session = await started(task, VICTIM_ITEM)
    other = await started(task, VICTIM_ITEM)
    try:
        assert "Connection was killed" in await sql(session, tool_call, "KILL CONNECTION_ID()")
        for _ in range(2):
            assert "the connection to the database is closed" in await sql(session, tool_call, "SELECT 1")
        assert await sql(other, tool_call, "SELECT 1") == "[(1,)]"
    finally:
        await session.close()
        await other.close()
    assert await task.backend.leftovers() == []


async def test_admin_statements_are_bounded_and_failed_drops_are_retried(mariadb_url):
    backend = MySQLBackend(mariadb_url, statement_timeout=1.0, max_threads=4, admin_timeout=1.0)
    await backend.start()
    tables = tables_of(load_items()[VICTIM_ITEM])
    try:
        stuck = await backend.open(tables)
        holder = root(mariadb_url)  # anything holding a lock on the session's table, forever
        try:
            with holder.cursor() as cursor:
                cursor.execute(f"LOCK TABLES `{stuck.name}`.`{VICTIM_TABLE}` WRITE")
            await asyncio.wait_for(stuck.close(), HANG_GUARD)
            assert await backend.leftovers() == [stuck.name]
            other = await asyncio.wait_for(backend.open(tables), HANG_GUARD)
            assert await other.execute(f"SELECT count(*) FROM {VICTIM_TABLE}") == [(40,)]
        finally:
            holder.close()
        await other.close()  # drops its own database, and the one left over
        assert await backend.leftovers() == []
    finally:
        await backend.stop()
