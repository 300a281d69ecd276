"""DBBench on the embedded SQLite backend, calling the task and its sessions directly."""

from __future__ import annotations

import ast

import pytest

from env_adapters.protocol import SampleStatus
from env_adapters.task import InvalidAction, TaskError, get_task_class
from env_adapters.tasks.dbbench.items import is_hash_scored, load_items

# Items whose vendored reference query runs unchanged in SQLite and yields the label (the others have upstream
# syntax errors, wrong names, or labels computed on typed columns; see the MySQL oracle test for repairs).
SQLITE_ORACLE_ITEMS = [3, 4, 14]


@pytest.fixture
async def task():
    task = get_task_class("db")(statement_timeout=0.5, max_rounds=3)
    await task.setup()
    yield task
    await task.teardown()


async def started(task, index=-1, custom_task=None):
    session = await task.start_session(index, custom_task)
    opening = await session.reset()
    return session, opening


def rows_of(reply):
    return ast.literal_eval(reply.messages[0]["content"])


async def test_serves_only_select_like_items(task):
    items = load_items()
    assert task.indices() == [i for i, item in enumerate(items) if not is_hash_scored(item)]
    assert len(task.indices()) == 20
    with pytest.raises(TaskError, match="backend: mysql"):
        await task.start_session(20)


@pytest.mark.parametrize("index", SQLITE_ORACLE_ITEMS)
async def test_reference_query_answer_earns_reward_1(task, tool_call, index):
    session, opening = await started(task, index)
    try:
        assert [m["role"] for m in opening.messages] == ["system", "user"]
        assert {t["function"]["name"] for t in opening.tools} == {"execute_sql", "commit_final_answer"}
        reply = await session.step(tool_call("execute_sql", query=task.items[index]["sql"]["query"]))
        assert reply.status is SampleStatus.RUNNING
        answers = [str(v) for row in rows_of(reply) for v in row]
        done = await session.step(tool_call("commit_final_answer", answers=answers))
        assert (done.status, done.reward, done.metrics["correct"]) == (SampleStatus.COMPLETED, 1.0, True)
    finally:
        await session.close()
    assert task.backend.open_databases == 0


async def test_wrong_answer_earns_0(task, tool_call):
    session, _ = await started(task, 3)
    try:
        done = await session.step(tool_call("commit_final_answer", answers=["27"]))
        assert (done.status, done.reward) == (SampleStatus.COMPLETED, 0.0)
    finally:
        await session.close()


async def test_round_limit_truncation_and_errors(task, tool_call):
    session, _ = await started(task, 10)  # 30+ rows: far over 800 characters
    try:
        reply = await session.step(tool_call("execute_sql", query="SELECT * FROM `Radio Stations`"))
        content = reply.messages[0]["content"]
        assert content.endswith("[TRUNCATED]") and len(content) == 800 + len("[TRUNCATED]")
        reply = await session.step(tool_call("execute_sql", query="SELEC nonsense"))
        assert reply.messages[0]["content"].startswith("Error: ") and reply.status is SampleStatus.RUNNING
        reply = await session.step(tool_call("execute_sql", query="SELECT 1"))
        assert (reply.status, reply.reward) == (SampleStatus.TASK_LIMIT_REACHED, 0.0)
        assert reply.metrics["sql_errors"] == 1 and reply.metrics["rounds"] == 3
    finally:
        await session.close()


async def test_runaway_statement_is_interrupted_and_session_goes_on(task, tool_call):
    session, _ = await started(task, 3)
    try:
        forever = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
        reply = await session.step(tool_call("execute_sql", query=forever))
        assert "timed out after 0.5 s" in reply.messages[0]["content"]
        reply = await session.step(tool_call("execute_sql", query="SELECT 2"))
        assert rows_of(reply) == [(2,)]
    finally:
        await session.close()


async def test_attach_and_files_are_refused(task, tool_call, tmp_path):
    session, _ = await started(task, 3)
    try:
        for sql in (f"ATTACH DATABASE '{tmp_path / 'x.db'}' AS x", f"VACUUM INTO '{tmp_path / 'y.db'}'"):
            reply = await session.step(tool_call("execute_sql", query=sql))
            assert reply.messages[0]["content"] in ("Error: not authorized", "Error: authorization denied")
        assert list(tmp_path.iterdir()) == []
    finally:
        await session.close()


async def test_message_without_tool_call_is_an_invalid_action(task):
    session, _ = await started(task, 3)
    try:
        with pytest.raises(InvalidAction):
            await session.step({"role": "assistant", "content": "SELECT 1"})
    finally:
        await session.close()


async def test_custom_item(task, tool_call):
    item = {"description": "How many rows?", "type": ["counting"], "label": ["2"],
            "table": {"table_name": "t", "table_info": {"columns": [{"name": "x"}], "rows": [["a"], ["b"]]}}}
    session, opening = await started(task, -1, item)
    try:
        assert "Question: How many rows?" in opening.messages[1]["content"]
        reply = await session.step(tool_call("execute_sql", query="SELECT count(*) FROM t"))
        done = await session.step(tool_call("commit_final_answer", answers=[str(rows_of(reply)[0][0])]))
        assert done.reward == 1.0
    finally:
        await session.close()
    with pytest.raises(TaskError, match="lacks 'label'"):
        await task.start_session(-1, {k: v for k, v in item.items() if k != "label"})


def test_bad_options_are_named():
    cls = get_task_class("db")
    with pytest.raises(ValueError, match="backend must be"):
        cls(backend="postgres")
    with pytest.raises(ValueError, match="set backend: mysql"):
        cls(mysql_url="mysql://root@127.0.0.1:3306")
