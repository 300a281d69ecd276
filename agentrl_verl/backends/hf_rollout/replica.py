"""The ``hf`` rollout replica: launches one :class:`HFRolloutServer` actor per replica, on its worker's device.

A replica of the hf backend is one device (tensor/pipeline/data parallel size 1): with N trainer ranks in
hybrid mode there are N replicas, each serving from the GPU (or CPU) of its rank. Replica groups with their own
weights (e.g. a pool of stale policies) use a distinct ``name_suffix``; their servers and adapters are then
named apart from the main group's.
"""

from __future__ import annotations

import asyncio

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.plugin.platform import get_platform
from verl.single_controller.ray import RayClassWithInitArgs
from verl.utils.device import get_resource_name
from verl.workers.rollout.replica import RolloutReplica

from agentrl_verl.backends.hf_rollout.adapter import server_actor_name
from agentrl_verl.backends.hf_rollout.server import HFRolloutServer


class HFReplica(RolloutReplica):
    """verl ``RolloutReplica`` for the ``hf`` backend (``actor_rollout_ref.rollout.name=hf``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.world_size != 1:
            raise ValueError(
                "the hf rollout backend serves each replica from one device; set rollout "
                f"tensor_model_parallel_size, data_parallel_size and pipeline_model_parallel_size to 1 "
                f"(their product is {self.world_size})"
            )
        self.server_class = ray.remote(HFRolloutServer)

    def get_ray_class_with_init_args(self) -> RayClassWithInitArgs:
        """Checkpoint-engine workers of colocated/standalone replicas; their adapter gets this group's names."""
        init = super().get_ray_class_with_init_args()
        init.kwargs["name_suffix"] = self.name_suffix
        return init

    async def launch_servers(self) -> None:
        """Start the server actor on the node and device of this replica's worker."""
        if len(self.workers) != self.world_size:
            raise RuntimeError(f"hf replica {self.replica_rank}: expected 1 worker, got {len(self.workers)}")
        resource = get_resource_name()
        node_id, device = await self.workers[0].__ray_call__.remote(
            lambda self: (
                ray.get_runtime_context().get_node_id(),
                ray.get_runtime_context().get_accelerator_ids()[resource][0],
            )
        )
        name = server_actor_name(self.replica_rank, self.name_suffix)
        env_vars = {
            **{var: "1" for var in get_platform().ray_noset_envvars()},
            **get_platform().rollout_env_vars(),
        }
        server = self.server_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            runtime_env={"env_vars": env_vars},
            name=name,
            max_concurrency=self.max_concurrency,
        ).remote(
            config=self.config,
            model_config=self.model_config,
            rollout_mode=self.rollout_mode,
            replica_rank=self.replica_rank,
            visible_devices=str(device),
            server_name=name,
        )
        # Construction loads the model; surface its errors here rather than at the first request.
        address, _ = await server.get_server_address.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{address}/{name}"

    async def sleep(self) -> None:
        await asyncio.gather(*[server.wait_for_requests_to_drain.remote() for server in self.servers])
        await super().sleep()
