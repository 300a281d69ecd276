"""kg on Virtuoso Open Source started by the task: the 1,000-item oracle, transcripts identical to the embedded
store's (gold traces and wrong or malformed calls), and nothing left behind (server process or folder)."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from env_adapters.tasks.kg.backends import VIRTUOSO_PREFIX
from env_adapters.tasks.kg.expert import kg_expert
from env_adapters.tasks.kg.task import KGTask

from .kg_support import play

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
        # A 10 KB entity id: its query is too long for a GET's URL on Virtuoso (400), so it goes by POST.
        session = await virtuoso.start_session(0)
        await session.reset()
        reply = await session.step({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                    "function": {"name": "get_relations",
                                                 "arguments": '{"variable": "m.%s"}' % ("x" * 10_000)}}]})
        assert reply.messages[0]["content"] == "Observation: []" and not reply.status.finished
        await session.close()
    finally:
        await virtuoso.teardown()
        await embedded.teardown()
    assert not Path(f"/proc/{server_pid}").exists() and not folder.exists()
    assert own_folders() == []
