"""DBBench through the real controller and worker processes, on MariaDB: oracle answers, wrong answers, hostile
and cancelled sessions, a killed worker; no database, server process or folder may be left behind."""

from __future__ import annotations

import ast
import asyncio
import glob
import time
from pathlib import Path

import pytest

from env_adapters.client import EnvClient
from env_adapters.launcher import EnvStack
from env_adapters.protocol import SampleStatus
from env_adapters.sandbox.mariadb import DIR_PREFIX, reap_stale_servers
from env_adapters.tasks.dbbench.items import is_hash_scored, load_items

pytestmark = [pytest.mark.slow, pytest.mark.mysql]

ITEMS = load_items()
# SELECT-like dev items whose vendored reference query reproduces the label unchanged.
REFERENCE_OK = [3, 4, 10, 14]
# Reference queries repaired mechanically (backquoted names, missing spaces, names as the item's table has them,
# numeric casts where the label was computed on a typed column); each then reproduces the label.
REPAIRED = {
    2: "SELECT `weeks at No. 1` FROM `Music Chart History` WHERE Artist = 'Julie Covington' "
       "AND Title = '\"Don''t Cry for Me Argentina\"'",
    6: "SELECT `Wrestler:` FROM `Wrestler Title Reigns` WHERE `Date:` LIKE '%1992%' GROUP BY `Wrestler:` "
       "HAVING COUNT(*) = 1",
    7: "SELECT Score FROM `Football Matches` WHERE Result = '2–1' AND Competition = 'Friendly' AND Goal < 17",
    8: "SELECT Average FROM `Football Team Performance` WHERE `W-L-T` = '5-1' AND Season < '2001' AND Games < '6'",
    9: "SELECT Average FROM Beauty_Pageant_Scores WHERE State = 'South Carolina' AND Interview < 9.626",
    12: "SELECT MIN(Touchdowns) FROM football_stats WHERE Points = '11'",
    13: "SELECT Crowd FROM `Australian Rules Football Matches` WHERE `Home team score` = '13.17 (95)' "
        "ORDER BY Crowd DESC LIMIT 1",
    16: "SELECT MIN(CAST(Round AS UNSIGNED)) FROM `Race Results` WHERE `Fastest Lap` = 'Takashi Kogure'",
    17: "SELECT MAX(Bronze) FROM `Medal Tally` WHERE Silver < 0",
    18: "SELECT MAX(Attendance) FROM `Baseball Team Record` WHERE Record = '15-28'",
    19: "SELECT AVG(Total) FROM Olympic_medal_counts WHERE Gold = 0 AND Nation = 'Iran'",
}
# Not reproducible from the vendored data: 0 (no row has the asked date), 1 (label differs from the table's value),
# 5 (an empty column name, which MySQL rejects; not served), 11 and 15 (labels contradict the table).
ORACLE_SQL = {i: ITEMS[i]["sql"]["query"] for i in REFERENCE_OK} | REPAIRED | {
    i: item["label"][0] for i, item in enumerate(ITEMS) if is_hash_scored(item)}  # the items' own statements
CONCURRENCY = 8


def call(name, **arguments):
    import json

    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": function}]}


@pytest.fixture(scope="module")
def stack(env_stack, mariadb_url):
    return env_stack("db", options={"backend": "mysql", "mysql_url": mariadb_url, "statement_timeout": 1.0},
                     concurrency=CONCURRENCY)


async def episode(env: EnvClient, index: int, sql: str | None, answers: list[str] | None = None) -> float:
    """Run ``sql`` (if any), then commit its values (``answers`` if given; an empty result commits "None")."""
    started = await env.start_sample("db", index)
    assert started.status is SampleStatus.RUNNING, started
    if sql is not None:
        reply = await env.interact(started.session_id, call("execute_sql", query=sql))
        content = reply.messages[0]["content"]
        assert reply.status is SampleStatus.RUNNING and not content.startswith("Error"), (index, content)
        values = [str(v) for row in ast.literal_eval(content) for v in row]
        answers = answers if answers is not None else (values or ["None"])
    done = await env.interact(started.session_id, call("commit_final_answer", answers=answers))
    assert done.status is SampleStatus.COMPLETED and done.finish
    return done.reward


async def test_oracle_and_wrong_answers(stack, mariadb_sessions):
    gate = asyncio.Semaphore(CONCURRENCY)

    async def limited(coro):
        async with gate:
            return await coro

    async with EnvClient(stack.url) as env:
        served = await env.get_indices("db")
        assert sorted(served) == [i for i in range(len(ITEMS)) if i != 5]
        oracle = await asyncio.gather(*(limited(episode(env, i, ORACLE_SQL[i])) for i in sorted(ORACLE_SQL)))
        # Wrong: an unmodified table for INSERT/UPDATE items, a wrong value otherwise.
        wrong = await asyncio.gather(*(limited(episode(env, i, None, ["not the answer"])) for i in served))
    assert dict(zip(sorted(ORACLE_SQL), oracle, strict=True)) == {i: 1.0 for i in ORACLE_SQL}
    assert len([i for i in ORACLE_SQL if is_hash_scored(ITEMS[i])]) == 40
    assert set(wrong) == {0.0}
    assert mariadb_sessions() == ([], 0)


async def test_hostile_and_cancelled_sessions_leave_nothing(stack, mariadb_sessions):
    async with EnvClient(stack.url) as env:
        victim = await env.start_sample("db", 3)
        attacker = await env.start_sample("db", 3)
        databases, _ = mariadb_sessions()
        assert len(databases) == 2
        for name in databases:  # the victim's and its own (which it may drop)
            reply = await env.interact(attacker.session_id, call("execute_sql", query=f"DROP DATABASE `{name}`"))
            assert reply.status is SampleStatus.RUNNING
        reply = await env.interact(victim.session_id, call("execute_sql", query="SELECT count(*) FROM "
                                                                                   "skyscrapers_in_Columbus"))
        assert reply.messages[0]["content"] == f"[({len(ITEMS[3]['table']['table_info']['rows'])},)]"
        reply = await env.interact(attacker.session_id, call("execute_sql", query="SELECT SLEEP(1000)"))
        assert reply.status is SampleStatus.RUNNING and "timed out after 1 s" in reply.messages[0]["content"]
        # Cancel one session in the middle of a statement and another between steps.
        sleeping = asyncio.ensure_future(env.interact(victim.session_id, call("execute_sql", query="SELECT SLEEP(5)")))
        await asyncio.sleep(0.3)
        await env.cancel(victim.session_id)
        await env.cancel(attacker.session_id)
        await asyncio.wait([sleeping])
    deadline = time.monotonic() + 10
    while mariadb_sessions() != ([], 0) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert mariadb_sessions() == ([], 0)


def test_killed_worker_takes_its_server_along(tmp_path):
    """A worker that starts its own MariaDB is SIGKILLed: the server dies with it; its folder is reaped later.
    (A graceful stop runs the task's teardown, which stops the server: see test_mariadb_server.py.)"""
    stack = EnvStack({"controller": {"port": 0}, "workers": [
        {"task": "db", "concurrency": 2, "heartbeat_interval": 0.5, "options": {"backend": "mysql"}}]},
        log_dir=tmp_path)
    stack.start()
    try:
        worker_pid = stack.workers[0][1].pid
        folders = glob.glob(f"/tmp/{DIR_PREFIX}{worker_pid}-*")
        assert len(folders) == 1, folders
        folder = Path(folders[0])
        server_pid = int((folder / "mariadbd.pid").read_text())
        stack.kill_worker(0)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{server_pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{server_pid}").exists(), "the killed worker's MariaDB is still running"
        assert folder in reap_stale_servers()
        assert not folder.exists()
    finally:
        stack.stop()
