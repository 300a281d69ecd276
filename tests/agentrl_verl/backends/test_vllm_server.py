"""The pause fixes of verl's vLLM server (:mod:`agentrl_verl.backends.vllm_server`): needed, right, and what they do.

The ``vllm``-marked checks read facts from the vLLM environment (``conftest.py``); the rest run on stand-ins.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from agentrl_verl.backends import vllm_server


@pytest.mark.vllm  # reads facts from the vLLM environment
def test_pause_api_fix_is_needed_and_right(facts):
    assert facts["verl_passes_wait_for_inflight"], "verl no longer passes wait_for_inflight_requests: drop the fix"
    assert "wait_for_inflight_requests" not in facts["vllm_pause_parameters"], (
        "vLLM's AsyncLLM.pause_generation takes wait_for_inflight_requests again: the pause-API fix is unnecessary")
    assert "mode" in facts["vllm_pause_parameters"], "AsyncLLM.pause_generation has no `mode`: re-check the fix"
    assert facts["pause_adapted"], "the plugin did not adapt AsyncLLM.pause_generation on its import"


async def test_pause_api_fix_maps_the_old_argument_onto_mode():
    calls = []

    class AsyncLLM:
        async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
            calls.append((mode, clear_cache))

    module = types.ModuleType("fake_async_llm")
    module.AsyncLLM = AsyncLLM
    assert vllm_server.accept_wait_for_inflight_requests(module) is True
    assert vllm_server.accept_wait_for_inflight_requests(module) is True  # idempotent
    await AsyncLLM().pause_generation(wait_for_inflight_requests=False, clear_cache=False)
    await AsyncLLM().pause_generation(wait_for_inflight_requests=True)
    await AsyncLLM().pause_generation(mode="keep")
    assert calls == [("abort", False), ("wait", True), ("keep", True)]

    class OldAsyncLLM:
        async def pause_generation(self, *, wait_for_inflight_requests: bool = False) -> None: ...

    module.AsyncLLM = OldAsyncLLM
    assert vllm_server.accept_wait_for_inflight_requests(module) is False  # nothing to adapt
    assert not hasattr(OldAsyncLLM.pause_generation, "__agentrl_compat__")


@pytest.mark.vllm  # reads facts from the vLLM environment
def test_server_pause_is_needed_and_right(facts):
    assert facts["server_pause_added"], (
        "verl's vLLM server has a pause_generation of its own now: drop vllm_server.add_pause_generation")
    assert facts["seam_vllm_entries"] == 4 and facts["seam_vllm_errors"] == [], facts["seam_vllm_errors"]


async def test_server_pause_closes_the_gate_and_waits_for_running_requests():
    class Engine:
        def __init__(self) -> None:
            self.pauses: list[dict] = []

        async def pause_generation(self, **kwargs: Any) -> None:
            self.pauses.append(kwargs)

    class vLLMHttpServer:  # verl's name; the state of its admission gate
        def __init__(self, node_rank: int = 0) -> None:
            self.node_rank, self.engine = node_rank, Engine()
            self._submission_paused, self._rejecting, self._admitting = False, True, 1
            self._resume_event = asyncio.Event()
            self._resume_event.set()

    module = types.ModuleType("fake_vllm_async_server")
    module.vLLMHttpServer = vLLMHttpServer
    assert vllm_server.add_pause_generation(module) is True
    assert vllm_server.add_pause_generation(module) is True  # idempotent
    server = vLLMHttpServer()
    pause = asyncio.create_task(server.pause_generation())
    await asyncio.sleep(0.05)
    # The gate is closed (new requests park, none is rejected), but a request past it has yet to reach the engine.
    assert server._submission_paused and not server._rejecting and not server._resume_event.is_set()
    assert not pause.done() and server.engine.pauses == []
    server._admitting = 0
    await pause
    assert server.engine.pauses == [{"wait_for_inflight_requests": True, "clear_cache": True}]
    other_rank = vLLMHttpServer(node_rank=1)  # no engine of its own
    await other_rank.pause_generation()
    assert other_rank.engine.pauses == [] and not other_rank._submission_paused

    class ServerWithPause(vLLMHttpServer):
        async def pause_generation(self) -> None: ...

    module.vLLMHttpServer = ServerWithPause
    assert vllm_server.add_pause_generation(module) is False


def test_every_callback_given_for_a_module_runs_once_after_its_import(tmp_path, monkeypatch):
    (tmp_path / "agentrl_later_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def first(module):
        seen.append(("first", module.VALUE))

    def second(module):
        seen.append(("second", module.VALUE))

    vllm_server.on_import("agentrl_later_module", first)
    vllm_server.on_import("agentrl_later_module", second)
    vllm_server.on_import("agentrl_later_module", first)  # given twice, runs once
    assert seen == []
    import agentrl_later_module  # noqa: F401

    assert seen == [("first", 1), ("second", 1)]
    vllm_server.on_import("agentrl_later_module", first)  # already imported: at once
    assert seen[-1] == ("first", 1)
