"""A checkpoint engine that moves weights through Ray's object store (``checkpoint_engine.backend=ray_object_store``).

verl's checkpoint engines for standalone rollout replicas (nccl, nixl, hccl, mooncake) need accelerators. This one
needs only Ray, so standalone replicas (e.g. the stale pool of cross-policy sampling) can be synced on a CPU
machine: actor rank 0 puts the weights into the object store in buckets of ``update_weights_bucket_megabytes`` and
announces them on a small mailbox actor; every rollout worker reads the buckets in order. It copies every tensor
to host memory, so it is meant for small models and CPU runs; on GPUs use ``nccl``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Generator
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

BACKEND = "ray_object_store"


@ray.remote(num_cpus=0)
class _Mailbox:
    """Ordered list of bucket references for one weight update; readers wait for buckets not yet sent."""

    def __init__(self) -> None:
        self._buckets: list[list[ray.ObjectRef] | None] = []
        self._changed = asyncio.Condition()

    async def put(self, bucket: list[ray.ObjectRef] | None) -> None:
        """Append a bucket (a one-element list, so Ray passes the reference, not the value); None ends the update."""
        async with self._changed:
            self._buckets.append(bucket)
            self._changed.notify_all()

    async def get(self, index: int) -> list[ray.ObjectRef] | None:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._buckets) > index)
            return self._buckets[index]


class ObjectStoreCheckpointEngine(CheckpointEngine):
    """Weight transfer from actor rank 0 to every rollout worker through the Ray object store.

    Args:
        bucket_size: Bytes per bucket (``update_weights_bucket_megabytes << 20``).
    """

    def __init__(self, bucket_size: int, **kwargs: Any) -> None:
        self.bucket_size = bucket_size
        self.rank: int | None = None
        self.mailbox_name = ""
        self.mailbox: ray.actor.ActorHandle | None = None
        self._owned_refs: list[ray.ObjectRef] = []

    def prepare(self) -> dict[str, Any]:
        # Every worker offers a mailbox name; build_topology keeps actor rank 0's and the others go unused.
        return {"mailbox": f"ckpt_mailbox_{uuid.uuid4().hex}"}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        mailbox = metadata[0]["mailbox"]  # actor rank 0 comes first
        actor = {"rank": list(range(actor_wg_world_size)), "mailbox": [mailbox] * actor_wg_world_size}
        rollout = {"rank": [-1] * rollout_world_size, "mailbox": [mailbox] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank: int, mailbox: str) -> None:
        self.rank, self.mailbox_name = rank, mailbox
        if rank == 0:
            self.mailbox = _Mailbox.options(name=mailbox).remote()
            ray.get(self.mailbox.__ray_ready__.remote())

    def finalize(self) -> None:
        # The manager calls finalize after every receiver has read all buckets, so the data can go now.
        if self.rank == 0 and self.mailbox is not None:
            ray.kill(self.mailbox)
        self.mailbox, self._owned_refs = None, []

    async def send_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None
    ) -> dict:
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in weights:  # all actor ranks drain the generator: producing tensors is collective
            if self.rank != 0:
                continue
            tensor = tensor.detach().to("cpu", copy=True)
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= self.bucket_size:
                await self._put(bucket)
                bucket, size = [], 0
        if self.rank == 0:
            if bucket:
                await self._put(bucket)
            await self.mailbox.put.remote(None)
        return {}

    async def _put(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        ref = ray.put(bucket)
        self._owned_refs.append(ref)  # the sender owns the object: keep it alive until finalize
        await self.mailbox.put.remote([ref])

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        # Looked up here, not in init_process_group: the manager initialises senders and receivers concurrently.
        mailbox = ray.get_actor(self.mailbox_name)
        index = 0
        while (refs := await mailbox.get.remote(index)) is not None:
            for name, tensor in await refs[0]:
                yield name, tensor
            index += 1


def register() -> None:
    """Called by :mod:`agentrl_verl.plugin` (also in every Ray worker): adds the ``ray_object_store`` backend."""
    CheckpointEngineRegistry.register(BACKEND)(ObjectStoreCheckpointEngine)


register()  # importing the module registers it: agentrl_verl.plugin imports it with its verl package
