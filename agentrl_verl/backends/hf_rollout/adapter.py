"""The ``hf`` server adapter: what verl's trainer workers and checkpoint engine use to reach an ``hf`` server.

verl builds one adapter per trainer rank (``get_rollout_class(name, "async")``) in hybrid mode, and one per
``CheckpointEngineWorker`` for colocated/standalone replicas. The adapter finds its replica's server actor by
name and forwards sleep/wake-up and weight updates to it. All ranks must drain the weight generator (FSDP
gathers full tensors collectively), but only the replica's first rank sends them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Generator
from typing import Any

import ray
import torch
from torch.distributed.device_mesh import DeviceMesh
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout

logger = logging.getLogger(__name__)

SERVER_NAME_PREFIX = "hf_server_"
ROLLOUT_ENGINE_KEY = "hf"  # our key under actor_rollout_ref.rollout.engine_kwargs


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
        hf_kwargs = (self.config.engine_kwargs or {}).get(ROLLOUT_ENGINE_KEY) or {}
        self.sync_weights = bool(hf_kwargs.get("sync_weights", True))

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
        """Send full named tensors to the server in buckets of ``update_weights_bucket_megabytes``.

        Raises:
            NotImplementedError: For delta updates or LoRA adapters (not supported by the hf backend).
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout backend takes wire_format='named_tensors', not {wire_format!r}")
        if peft_config is not None:
            raise NotImplementedError("the hf rollout backend cannot load LoRA adapters; set model.lora.merge=True")
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        async for name, tensor in _iterate(weights):
            if not (self.is_leader_rank and self.sync_weights):
                continue  # still drained: producing each tensor is collective across trainer ranks
            tensor = tensor.detach().to("cpu", copy=True)
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= self.bucket_bytes:
                await self._server().update_weights.remote(bucket)
                bucket, size = [], 0
        if not (self.is_leader_rank and self.sync_weights):
            return
        if bucket:
            await self._server().update_weights.remote(bucket)
        await self._server().clear_kv_cache.remote()
        if global_steps is not None:
            await self._server().set_global_steps.remote(global_steps)


async def _iterate(weights: Any) -> AsyncIterator[tuple[str, torch.Tensor]]:
    """Iterate a weight generator that may be sync (trainer engines) or async (checkpoint engines)."""
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item
