"""Test hook: the first weight update of an ``agentrl_async`` run lands while a turn is decoding (vLLM or ``hf``).

Without it, an update finds a turn decoding only by chance: with ``interrupt: true`` it aborts only what happens to be
decoding at that instant (a run could train no interrupted turn at all), with ``interrupt: false`` no episode may be
running across it. Loaded in every process of the run by ``VERL_USE_EXTERNAL_MODULES`` (after
``agentrl_verl.plugin``), active where :data:`RELEASE_ENV` names the release file of the ``held_chatter`` task:

* in vLLM's server process, it counts the tokens each request has generated so far (wrapping ``AsyncLLM.generate``)
  and gives verl's server ``decoding_requests()``: the requests with at least one token and three quarters of their
  ``max_tokens`` still to come; the ``hf`` server gets the same, read from its engine's running requests;
* in the trainer, at the first update, it creates the release file (the held episodes go on and their next turns
  start), waits until a server reports such a request, and only then lets the update (and its abort) proceed.

With ``ignore_eos`` every turn runs to its ``max_tokens``, so the request found decoding is still decoding when the
abort reaches it a few milliseconds later.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from agentrl_verl.backends.vllm_server import ASYNC_LLM_MODULE, VLLM_SERVER_MODULE, on_import

RELEASE_ENV = "AGENTRL_TEST_RELEASE_FILE"
HF_SERVER_MODULE = "agentrl_verl.backends.hf_rollout.server"
HOLD_TIMEOUT_S = 600.0
logger = logging.getLogger(__name__)
_decoding: dict[str, tuple[int, int]] = {}  # request id -> (tokens so far, max_tokens), in vLLM's server process


def _count_tokens(module: ModuleType) -> None:
    generate = module.AsyncLLM.generate

    async def counting_generate(self: Any, *args: Any, **kwargs: Any):
        request_id, params = kwargs.get("request_id"), kwargs.get("sampling_params")
        try:
            async for output in generate(self, *args, **kwargs):
                if output.outputs and params is not None:
                    _decoding[request_id] = (len(output.outputs[0].token_ids), params.max_tokens)
                yield output
        finally:
            _decoding.pop(request_id, None)

    module.AsyncLLM.generate = counting_generate


def _early(done: int, total: int) -> bool:
    """A request that is decoding with three quarters of its tokens still to come (so still decoding when aborted)."""
    return 0 < done <= total // 4


async def _decoding_requests(self: Any) -> int:
    return sum(1 for done, total in _decoding.values() if _early(done, total))


def _add_report(module: ModuleType) -> None:
    module.vLLMHttpServer.decoding_requests = _decoding_requests


async def _hf_decoding_requests(self: Any) -> int:
    running = self.engine._rows  # the engine's decoding requests, in the server's own process
    return sum(1 for request in running if _early(len(request.output_ids), request.params.max_tokens))


def _add_hf_report(module: ModuleType) -> None:
    module.HFRolloutServer.decoding_requests = _hf_decoding_requests


def _hold_first_update() -> None:
    import ray

    from agentrl_verl.core.async_trainer import AgentRLAsyncTrainer

    update = AgentRLAsyncTrainer.on_step_end

    def on_step_end(self: Any) -> None:
        release = Path(os.environ[RELEASE_ENV])
        if not release.exists():
            release.touch()
            servers = [server for replica in self.checkpoint_manager.replicas for server in replica.servers]
            deadline = time.monotonic() + HOLD_TIMEOUT_S
            while (found := sum(ray.get([server.decoding_requests.remote() for server in servers]))) == 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hold_update: no turn decoding {HOLD_TIMEOUT_S:.0f}s after the release")
                time.sleep(0.005)
            logger.warning("hold_update: update %d lands on %d decoding requests", self.global_steps, found)
        update(self)

    AgentRLAsyncTrainer.on_step_end = on_step_end


if os.environ.get(RELEASE_ENV):
    on_import(ASYNC_LLM_MODULE, _count_tokens)
    on_import(VLLM_SERVER_MODULE, _add_report)
    on_import(HF_SERVER_MODULE, _add_hf_report)
    _hold_first_update()
