"""Fixes of verl 0.9.1's vLLM server that the ``agentrl_async`` trainer needs wherever vLLM runs, GPU or CPU.

* **Pause API.** verl's ``vLLMHttpServer.abort_all_requests`` (weight updates of standalone replicas, aborts of
  the async trainer) calls ``AsyncLLM.pause_generation(wait_for_inflight_requests=False)``; vLLM replaced that
  argument by ``mode`` ("abort", "wait", "keep"). Where ``pause_generation`` lacks the old argument,
  :func:`accept_wait_for_inflight_requests` makes it accept it again, mapped onto ``mode``, as soon as vLLM's
  ``AsyncLLM`` module is imported (verl imports its plugins before that module in the server's process).
* **Pause without abort.** The ``agentrl_async`` trainer pauses every rollout server before a weight update
  (``interrupt: false``): running generations finish on the current weights, new ones wait. verl's vLLM server
  can only abort; :func:`add_pause_generation` gives it a ``pause_generation`` that closes its admission gate and
  waits instead, when verl's vLLM server module is imported (before verl makes Ray actors of the class).

Each fix applies only where vLLM is installed and the release needs it (``tests/agentrl_verl/backends/
test_vllm_cpu.py`` fails when a vLLM or verl release makes one unnecessary or wrong).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

VLLM_DIST = "vllm"
VLLM_CPU_DIST = "vllm-cpu"


def distribution(name: str) -> metadata.Distribution | None:
    """The installed distribution ``name``, or None."""
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def metadata_has_vllm() -> bool:
    """Whether a vLLM distribution (``vllm``, or ``vllm-cpu``) is installed (without importing vLLM)."""
    return distribution(VLLM_DIST) is not None or distribution(VLLM_CPU_DIST) is not None

ASYNC_LLM_MODULE = "vllm.v1.engine.async_llm"


def _pause_with_old_argument(pause: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(pause)
    async def pause_generation(self: Any, *args: Any, wait_for_inflight_requests: bool | None = None,
                               **kwargs: Any) -> Any:
        if wait_for_inflight_requests is not None:
            kwargs.setdefault("mode", "wait" if wait_for_inflight_requests else "abort")
        return await pause(self, *args, **kwargs)

    pause_generation.__agentrl_compat__ = True  # type: ignore[attr-defined]
    return pause_generation


def accept_wait_for_inflight_requests(module: ModuleType) -> bool:
    """Let ``module.AsyncLLM.pause_generation`` take verl's ``wait_for_inflight_requests`` (idempotent).

    Returns:
        Whether the method needed it (it has ``mode`` and lacks the old argument).
    """
    pause = module.AsyncLLM.pause_generation
    if getattr(pause, "__agentrl_compat__", False):
        return True
    parameters = inspect.signature(pause).parameters
    if "wait_for_inflight_requests" in parameters or "mode" not in parameters:
        return False
    module.AsyncLLM.pause_generation = _pause_with_old_argument(pause)
    return True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs each of its callbacks on the module ``name`` right after it is executed, wherever it is first imported."""

    def __init__(self, name: str) -> None:
        self.name, self.callbacks = name, []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once is enough
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            for callback in self.callbacks:
                callback(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def on_import(name: str, callback: Callable[[ModuleType], Any]) -> None:
    """Run ``callback(module)`` on the module ``name`` now if it is imported, else right after its import.

    Callbacks of one module run in the order they were given; giving the same one twice runs it once.
    """
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _AfterImport) and f.name == name), None)
    if finder is None:
        finder = _AfterImport(name)
        sys.meta_path.insert(0, finder)
    if callback not in finder.callbacks:
        finder.callbacks.append(callback)


VLLM_SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"


async def _pause_generation(self: Any) -> None:
    """Close the admission gate without aborting; return once running requests have finished.

    What the ``agentrl_async`` trainer asks of every rollout server before a weight update with ``interrupt: false``
    (the ``hf`` server has its own): requests that arrive wait at verl's gate until ``resume_generation``, and those
    running finish on the current weights, so the update lands between turns. verl's ``abort_all_requests`` closes
    the same gate, then aborts instead of waiting.
    """
    if self.node_rank != 0:  # only rank 0 owns the engine (and admits requests), as in abort_all_requests
        return
    self._submission_paused = True
    self._rejecting = False
    self._resume_event.clear()
    while self._admitting > 0:  # requests already past the gate reach the engine first
        await asyncio.sleep(0.01)
    await self.engine.pause_generation(wait_for_inflight_requests=True, clear_cache=True)


def add_pause_generation(module: ModuleType) -> bool:
    """Give verl's ``module.vLLMHttpServer`` the ``pause_generation`` of :func:`_pause_generation` (idempotent).

    Returns:
        Whether the server has it from here (False: verl has its own).
    """
    server = module.vLLMHttpServer
    if getattr(server, "pause_generation", _pause_generation) is not _pause_generation:
        return False
    server.pause_generation = _pause_generation
    return True


def patch_pause_api() -> None:
    """Apply :func:`accept_wait_for_inflight_requests` to vLLM's ``AsyncLLM`` and :func:`add_pause_generation` to
    verl's vLLM server, now or when their modules are imported (before verl's replicas make Ray actors of it)."""
    if metadata_has_vllm():
        on_import(ASYNC_LLM_MODULE, accept_wait_for_inflight_requests)
        on_import(VLLM_SERVER_MODULE, add_pause_generation)


def register() -> None:
    """Apply both fixes where vLLM is installed, now or when their modules are imported."""
    patch_pause_api()
