"""The ``hf`` server adapter: what verl's trainer workers and checkpoint engine use to reach an ``hf`` server.

verl builds one adapter per trainer rank (``get_rollout_class(name, "async")``) in hybrid mode, and one per
``CheckpointEngineWorker`` for colocated/standalone replicas. The adapter finds its replica's server actor by
name and forwards sleep/wake-up and weight updates to it. All ranks must drain the weight generator (FSDP
gathers full tensors collectively), but only the replica's first rank sends them.

Weights travel by ``engine_kwargs.hf.weight_transport`` (:data:`WEIGHT_TRANSPORTS`). A server always runs on its
worker's host, so by default GPU tensors go by CUDA IPC through verl's bucketed ZMQ transfer (the server copies
device to device; no host round trip) and CPU tensors through Ray's object store.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Generator
from typing import Any

import ray
import torch
from torch.distributed.device_mesh import DeviceMesh
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout

from agentrl_verl.core.verl_seam import bucketed_weight_transfer

logger = logging.getLogger(__name__)

SERVER_NAME_PREFIX = "hf_server_"
ROLLOUT_ENGINE_KEY = "hf"  # our key under actor_rollout_ref.rollout.engine_kwargs
TRANSPORT_SETTING = f"actor_rollout_ref.rollout.engine_kwargs.{ROLLOUT_ENGINE_KEY}.weight_transport"
WEIGHT_TRANSPORTS = {
    "auto": "cuda_ipc for GPU tensors, object_store for CPU ones",
    "cuda_ipc": "verl's bucketed ZMQ transfer over one CUDA IPC buffer (tensors on the server's GPU)",
    "shm": "verl's bucketed ZMQ transfer over a POSIX shared-memory buffer (same host)",
    "object_store": "each bucket copied to host memory and passed through Ray's object store",
}
BUCKET_TIMEOUT_S = 600
"""Longest wait of the sender for the server to take one bucket (a server that failed never answers)."""


HF_ENGINE_KWARGS = {
    "sync_weights": "false keeps the rollout on its initial weights",
    "weight_transport": "how weight updates reach the server (WEIGHT_TRANSPORTS)",
    "physical_gpus": "cards per node where Ray counts more GPUs than that (server.card_of)",
}
"""Our settings under ``actor_rollout_ref.rollout.engine_kwargs.hf``."""


def hf_engine_kwargs(config: RolloutConfig) -> dict[str, Any]:
    """Our settings under ``actor_rollout_ref.rollout.engine_kwargs.hf`` (empty when none are given).

    Raises:
        ValueError: a key that is not one of :data:`HF_ENGINE_KWARGS` (a typo would otherwise be ignored).
    """
    kwargs = dict((config.engine_kwargs or {}).get(ROLLOUT_ENGINE_KEY) or {})
    unknown = sorted(set(kwargs) - set(HF_ENGINE_KWARGS))
    if unknown:
        raise ValueError(f"unknown key(s) actor_rollout_ref.rollout.engine_kwargs.{ROLLOUT_ENGINE_KEY}."
                         f"{', '.join(unknown)}: the hf backend reads {', '.join(HF_ENGINE_KWARGS)}")
    return kwargs


def server_actor_name(replica_rank: int, name_suffix: str = "") -> str:
    """Ray actor name of a replica's server (``name_suffix`` separates replica groups, e.g. a stale pool)."""
    return f"{SERVER_NAME_PREFIX}{replica_rank}{name_suffix}"


class HFServerAdapter(BaseRollout):
    """Client side of an ``hf`` server inside a trainer or checkpoint-engine worker.

    Args:
        config: Rollout config.
        model_config: Model config.
        device_mesh: Unused (the hf server does not shard); kept for verl's constructor signature.
        replica_rank: The replica to serve; -1 derives it from the worker's ``RANK``.
        name_suffix: Suffix of the replica group's server names (see :func:`server_actor_name`).
    """

    def __init__(
        self,
        config: RolloutConfig,
        model_config: HFModelConfig,
        device_mesh: DeviceMesh | None,
        replica_rank: int = -1,
        name_suffix: str = "",
    ) -> None:
        super().__init__(config, model_config, device_mesh)
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        self.server_name = server_actor_name(self.replica_rank, name_suffix)
        self.server_handle: ray.actor.ActorHandle | None = None
        self.bucket_bytes = self.config.checkpoint_engine.update_weights_bucket_megabytes << 20
        # engine_kwargs.hf.sync_weights=false keeps the rollout on its initial weights (a frozen behaviour
        # policy, for off-policy ablations and for checking that weight sync matters).
        hf_kwargs = hf_engine_kwargs(self.config)
        self.sync_weights = bool(hf_kwargs.get("sync_weights", True))
        self.weight_transport = str(hf_kwargs.get("weight_transport", "auto"))
        if self.weight_transport not in WEIGHT_TRANSPORTS:
            raise ValueError(
                f"{TRANSPORT_SETTING}={self.weight_transport!r}: use one of {', '.join(WEIGHT_TRANSPORTS)}")

    @property
    def is_leader_rank(self) -> bool:
        """Whether this rank talks to the server (the replica's first rank)."""
        return self.rollout_rank == 0

    def _server(self) -> ray.actor.ActorHandle:
        # Looked up lazily: in hybrid mode the server is launched after the trainer workers build adapters.
        if self.server_handle is None:
            self.server_handle = ray.get_actor(self.server_name)
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        """Bring the server's weights back onto its device (hybrid mode on GPU)."""
        if self.config.free_cache_engine and self.is_leader_rank:
            await self._server().wake_up.remote(tags=tags)

    async def release(self) -> None:
        """Move the server's weights off the device while the trainer runs (hybrid mode on GPU)."""
        if self.config.free_cache_engine and self.is_leader_rank:
            await self._server().sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        peft_config: Any = None,
        **kwargs: Any,
    ) -> None:
        """Send full named tensors to the server in buckets of ``update_weights_bucket_megabytes``, by the
        configured weight transport.

        Raises:
            NotImplementedError: For delta updates or LoRA adapters (not supported by the hf backend).
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout backend takes wire_format='named_tensors', not {wire_format!r}")
        if peft_config is not None:
            raise NotImplementedError("the hf rollout backend cannot load LoRA adapters; set model.lora.merge=True")
        stream = _iterate(weights)
        if not (self.is_leader_rank and self.sync_weights):
            async for _ in stream:  # still drained: producing each tensor is collective across trainer ranks
                pass
            return
        first = await anext(stream, None)
        if first is not None:
            transport = self._transport(first[1])
            started = time.monotonic()
            tensors = _prepend(first, stream)
            if transport == "object_store":
                sent = await self._send_by_object_store(tensors)
            else:
                sent = await self._send_by_zmq(tensors, use_shm=transport == "shm")
            logger.info("hf weight update of %s: %d tensors by %s in %.2f s", self.server_name, sent, transport,
                        time.monotonic() - started)
        await self._server().clear_kv_cache.remote()
        if global_steps is not None:
            await self._server().set_global_steps.remote(global_steps)

    def _transport(self, tensor: torch.Tensor) -> str:
        if self.weight_transport == "auto":
            return "cuda_ipc" if tensor.is_cuda else "object_store"
        if self.weight_transport == "cuda_ipc" and not tensor.is_cuda:
            raise ValueError(f"{TRANSPORT_SETTING}=cuda_ipc, but the weights to send are on {tensor.device}: use "
                             "shm or object_store (or auto) for weights in host memory")
        return self.weight_transport

    async def _send_by_object_store(self, tensors: AsyncIterator[tuple[str, torch.Tensor]]) -> int:
        bucket: list[tuple[str, torch.Tensor]] = []
        size = sent = 0
        async for name, tensor in tensors:
            tensor = tensor.detach().to("cpu", copy=True)
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= self.bucket_bytes:
                sent += await self._server().update_weights.remote(bucket)
                bucket, size = [], 0
        if bucket:
            sent += await self._server().update_weights.remote(bucket)
        return sent

    async def _send_by_zmq(self, tensors: AsyncIterator[tuple[str, torch.Tensor]], use_shm: bool) -> int:
        """verl's bucketed sender here, its receiver in the server (which loads each bucket as it arrives)."""
        handle = f"ipc:///tmp/agentrl-hf-weights-{uuid.uuid4().hex}.sock"
        received = self._server().receive_weights.remote(handle, use_shm=use_shm)
        sender = bucketed_sender(handle, self.bucket_bytes >> 20, use_shm)
        try:
            await sender.async_send_weights(tensors)
        except Exception as error:
            # The server's own error (e.g. a tensor name its model lacks) explains a sender left without answer.
            done, _ = await asyncio.wait([asyncio.wrap_future(received.future())], timeout=5)
            if done:
                done.pop().result()
            raise RuntimeError(f"hf weight update of {self.server_name} failed while sending: {error!r}") from error
        return await received


def bucketed_sender(handle: str, bucket_mb: int, use_shm: bool) -> Any:
    """verl's ``BucketedWeightSender`` at ``handle`` whose socket gives up after :data:`BUCKET_TIMEOUT_S` without an
    answer; ``bucket_mb`` megabytes per bucket, CUDA IPC or (``use_shm``) shared memory."""
    return _timed_sender_class()(zmq_handle=handle, bucket_size_mb=max(1, bucket_mb), use_shm=use_shm)


@functools.cache
def _timed_sender_class() -> type:
    import zmq

    class TimedSender(bucketed_weight_transfer().BucketedWeightSender):
        def _init_socket(self) -> None:
            super()._init_socket()
            self.socket.setsockopt(zmq.RCVTIMEO, BUCKET_TIMEOUT_S * 1000)
            self.socket.setsockopt(zmq.SNDTIMEO, BUCKET_TIMEOUT_S * 1000)

    return TimedSender


async def _prepend(first: tuple[str, torch.Tensor], rest: AsyncIterator[tuple[str, torch.Tensor]]
                   ) -> AsyncIterator[tuple[str, torch.Tensor]]:
    yield first
    async for item in rest:
        yield item


async def _iterate(weights: Any) -> AsyncIterator[tuple[str, torch.Tensor]]:
    """Iterate a weight generator that may be sync (trainer engines) or async (checkpoint engines)."""
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item
