"""kg on Virtuoso Open Source started by the task: the 1,000-item oracle, transcripts identical to the embedded
store's (gold traces and wrong or malformed calls), and nothing left behind (server process or folder)."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from env_adapters.sandbox.servers import free_port
from env_adapters.tasks.kg import backends
from env_adapters.tasks.kg.backends import VIRTUOSO_PREFIX
from env_adapters.tasks.kg.expert import kg_expert
from env_adapters.tasks.kg.task import KGTask

from .support import play

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("virtuoso-t") is None,
                                                   reason="Virtuoso is not installed (apt-get install -y "
                                                          "virtuoso-opensource)")]


def stumbling(task, index, messages):
    """The expert, after a few mistakes of the kinds agents make (unknown names, relations, variables)."""
    mistakes = [
        {"name": "get_relations", "arguments": '{"variable": "Nobody"}'},
        {"name": "get_neighbors", "arguments": '{"variable": "#9", "relation": "x.y.z"}'},
        {"name": "get_attributes", "arguments": '{"variable": "#0"}'},
        {"name": "lookup", "arguments": "{}"},
    ]
    step = sum(m["role"] == "assistant" for m in messages)
    if step < len(mistakes):
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"m{step}", "type": "function", "function": mistakes[step]}]}
    shifted = [m for m in messages if not (m["role"] == "tool" and m["tool_call_id"].startswith("m"))]
    return kg_expert(task, index, shifted)


def call(name: str, **arguments: str) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": function}]}


async def long_query_reply(task: KGTask, intersections: int = 6) -> str:
    """``get_relations`` of item 0's first neighbours intersected with themselves ``intersections`` times."""
    session = await task.start_session(0)
    await session.reset()
    entity = next(iter(task.items[0]["entities"]))
    relations = (await session.step(call("get_relations", variable=entity))).messages[0]["content"]
    relation = relations.split("[")[1].split(",")[0].rstrip("]")
    await session.step(call("get_neighbors", variable=entity, relation=relation))
    for k in range(intersections):
        await session.step(call("intersection", variable1=f"#{k}", variable2=f"#{k}"))
    reply = await session.step(call("get_relations", variable=f"#{intersections}"))
    await session.close()
    assert not reply.status.finished  # the episode goes on, whatever the store made of the query
    return reply.messages[0]["content"]


def own_folders() -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), f"{VIRTUOSO_PREFIX}{os.getpid()}-*"))


async def test_oracle_and_parity_with_embedded():
    options = {"seed": 5, "size": 1000}
    virtuoso, embedded = KGTask(backend="virtuoso", **options), KGTask(**options)
    await virtuoso.setup()
    await embedded.setup()
    try:
        server_pid, folder = virtuoso.server.pid, Path(virtuoso.server.folder)
        assert folder.is_dir() and Path(f"/proc/{server_pid}").exists()
        oracle = [await play(virtuoso, i) for i in virtuoso.indices()]
        assert [r.reward for r, _ in oracle] == [1.0] * 1000
        sample = range(0, 1000, 10)
        for policy in (kg_expert, stumbling):
            for i in sample:
                on_virtuoso, on_embedded = await play(virtuoso, i, policy), await play(embedded, i, policy)
                assert on_virtuoso[1] == on_embedded[1], i  # every observation, error message included
                assert (on_virtuoso[0].status, on_virtuoso[0].reward, on_virtuoso[0].metrics) == \
                    (on_embedded[0].status, on_embedded[0].reward, on_embedded[0].metrics)
        assert [r.metrics["tool_errors"] for r, _ in [await play(virtuoso, i, stumbling) for i in sample]] == \
            [4] * len(sample)
        # Six self-intersections: a query of about 9,000 encoded characters, past what a GET's URL may carry, goes by
        # POST and is answered as the embedded store answers it.
        assert [await long_query_reply(task) for task in (virtuoso, embedded)] == [await long_query_reply(embedded)] * 2
        assert (await long_query_reply(embedded)).startswith("Observation: [")
        # Seven: Virtuoso refuses the SQL it would generate as too long; the agent gets the family's tool error.
        assert (await long_query_reply(virtuoso, 7)).startswith("Error processing tool call: the store refused")
        assert await virtuoso.healthy()  # a store that answers (one that does not: test_backends.py)
    finally:
        await virtuoso.teardown()
        await embedded.teardown()
    assert not Path(f"/proc/{server_pid}").exists() and not folder.exists()
    assert own_folders() == []


def test_a_server_whose_port_another_process_took_first_starts_on_others(tmp_path, monkeypatch, caplog):
    with socket.socket() as holder:  # took the first picked port first: bound, not answering
        holder.bind(("127.0.0.1", 0))
        taken = holder.getsockname()[1]
        picks = iter([taken])
        monkeypatch.setattr(backends, "free_port", lambda: next(picks, None) or free_port())
        server = backends.VirtuosoServer(base_dir=tmp_path, memory_mb=64)
        with caplog.at_level(logging.WARNING, logger="env_adapters.sandbox.servers"):
            server.start()
        try:
            assert taken not in (server.sql_port, server.http_port) and server.running
        finally:
            server.stop()
    assert "lost one of its ports" in caplog.text and list(tmp_path.iterdir()) == []
