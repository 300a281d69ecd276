"""Policy pools in verl's rollout layer: the wiring of cross-policy sampling (:mod:`agentrl_verl.core.cross_policy`).

- :class:`PolicyPoolClient` is the server client the agent loops get (``server_manager``): for every turn it asks
  the :class:`~agentrl_verl.core.cross_policy.PolicyRouter` which pool member generates, forwards the call to that
  member's client, and tags the output with the member (``policy``) and the weight version of the server that
  produced it (``policy_version``; none for a fixed model). The tokens' log-probs are the producing server's,
  untouched.
- :class:`StalePool` is the pool's second member: a second group of rollout replicas of the same backend (vLLM,
  SGLang or ``hf``), with its own resource share (``stale_replicas`` standalone replicas) and its own
  checkpoint-engine manager, synced with the actor only every ``stale_refresh_steps`` steps; or, with
  ``fixed_model_path``, replicas serving that model as loaded from disk, never synced.
- :class:`CrossPolicyTrainerMixin` puts both into a verl V1 trainer (``class T(CrossPolicyTrainerMixin,
  PPOTrainerSync)``): it starts the second member's replicas beside verl's own setup (:class:`BesideSetup`), hands
  the pool client to the agent loops, refreshes the stale weights on schedule and logs the ``cross_policy/*`` metrics.
  With ``enable=false`` (the default) every hook passes straight through.

Evaluation pools of named external endpoints are built by :mod:`agentrl_verl.tools.evaluate`.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cachetools import LRUCache
from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.utils import Role
from verl.workers.rollout.llm_server import LLMServerClient, LLMServerManager
from verl.workers.rollout.replica import TokenOutput, get_rollout_replica_class

from agentrl_verl.core.config import CrossPolicyConfig, agentrl_config
from agentrl_verl.core.cross_policy import (
    CURRENT,
    FIXED,
    POLICY_KEY,
    POLICY_VERSION_KEY,
    STALE,
    PolicyRouter,
    TurnLog,
    cross_policy_metrics,
    stale_refresh_due,
    started_on,
    training_pool,
)
from agentrl_verl.core.episode import EpisodeRecord
from agentrl_verl.core.verl_seam import batch_fields

logger = logging.getLogger(__name__)

MAX_TRACKED_TRAJECTORIES = 100_000
"""Turn counters kept per pool client (least recently used trajectories are forgotten first)."""


class PolicyPoolClient(LLMServerClient):
    """Server client that sends every turn to the pool member the router draws.

    Args:
        config: verl's whole config (kept for parity with :class:`LLMServerClient`).
        members: Pool member name -> client with verl's ``generate`` signature (an ``LLMServerClient`` of a
            replica group, or an external endpoint client).
        router: Chooses the member per (trajectory, turn); the trajectory is verl's ``request_id`` (one per
            episode in multi-turn agent loops).
        fixed_members: Members whose weights never change: their turns carry no weight version.

    Raises:
        ValueError: the router can draw a member that has no client.
    """

    def __init__(
        self, config: Any, members: Mapping[str, Any], router: PolicyRouter, fixed_members: Iterable[str] = ()
    ) -> None:
        super().__init__(config=config, load_balancer_handle=None)
        missing = sorted(set(router.members) - set(members))
        if missing:
            raise ValueError(f"pool members {missing} have a probability but no server client")
        self.members = dict(members)
        self.router = router
        self.fixed_members = frozenset(fixed_members)
        self._turns: LRUCache = LRUCache(maxsize=MAX_TRACKED_TRAJECTORIES)

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        """Generate one turn on the drawn member; the output carries ``policy`` and ``policy_version``."""
        turn = self._turns.get(request_id, 0)
        self._turns[request_id] = turn + 1
        name = self.router.choose(request_id, turn)
        output = await self.members[name].generate(
            request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs
        )
        output.extra_fields[POLICY_KEY] = name
        fixed = name in self.fixed_members
        output.extra_fields[POLICY_VERSION_KEY] = None if fixed else started_on(output.extra_fields)
        return output


RANK_NAMED_BACKENDS = ("vllm", "sglang")

ACTOR_ROLES = (Role.Actor, Role.ActorRolloutRef, Role.ActorRollout)
"""The roles verl's actor worker group may take, in the order verl's setup looks for them."""


class _NamedReplicaManager(LLMServerManager):
    """``LLMServerManager`` whose replicas carry a ``name_suffix`` (their servers and pools are named apart)."""

    def __init__(self, config: DictConfig, *args: Any, name_suffix: str, **kwargs: Any) -> None:
        rollout = config.actor_rollout_ref.rollout
        replica_cls = get_rollout_replica_class(rollout.name, disaggregation_enabled=rollout.disaggregation.enabled)
        if rollout.name in RANK_NAMED_BACKENDS:
            # verl 0.9.1's server adapters of these engines look their server up as `<engine>_server_<rank>_<node>`,
            # ignoring the suffix; the stale pool's ranks follow the current pool's, which keeps the names apart.
            name_suffix = ""
        # LLMServerManager keeps a preset rollout_replica_class ("for recipe to change").
        self.rollout_replica_class = functools.partial(replica_cls, name_suffix=name_suffix)
        super().__init__(config, *args, **kwargs)


def replica_world_size(rollout: DictConfig) -> int:
    """Devices of one rollout replica (tensor x data x pipeline parallel), as verl counts them."""
    return rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size


def stale_pool_config(config: DictConfig, num_replicas: int, model_path: str = "") -> DictConfig:
    """verl's config with the rollout resource spec of ``num_replicas`` standalone replicas (one node).

    With ``model_path`` the replicas serve that model (its weights, config and tokenizer) loaded from disk: verl's
    ``dummy`` load format, meant for replicas that receive the actor's weights, becomes ``auto``.
    """
    rollout = config.actor_rollout_ref.rollout
    world_size = replica_world_size(rollout)
    stale = copy.deepcopy(config)
    with open_dict(stale):
        stale.actor_rollout_ref.rollout.nnodes = 1
        stale.actor_rollout_ref.rollout.n_gpus_per_node = num_replicas * world_size
        if model_path:
            model = stale.actor_rollout_ref.model
            model.path, model.hf_config_path, model.tokenizer_path = model_path, None, None
            if "dummy" in rollout.get("load_format", "dummy"):
                stale.actor_rollout_ref.rollout.load_format = "auto"
    return stale


class StalePool:
    """Standalone rollout replicas of the pool's second member: an earlier version of the actor's weights, or a
    fixed model.

    Args:
        config: verl's whole config.
        num_replicas: Replicas in the pool (each takes one replica's worth of devices).
        start_rank: First replica rank (after the replicas verl already runs, to keep actor names unique).
        model_path: A model the replicas load at start and keep (member ``fixed``, no weight sync); empty for the
            stale copy (member ``stale``), whose weights come from the actor once :meth:`connect` is called.

    The stale copy's checkpoint engine must reach standalone replicas (not ``naive``;
    :func:`~agentrl_verl.core.config.check_run` rejects that combination before the run starts).
    """

    def __init__(self, config: DictConfig, num_replicas: int, start_rank: int, model_path: str = "") -> None:
        self.name = FIXED if model_path else STALE
        self.start_rank = start_rank
        logger.info("cross-policy: starting the %s pool's replicas", self.name)
        self.manager = _NamedReplicaManager.create(
            config=stale_pool_config(config, num_replicas, model_path), start_rank=start_rank, name_suffix=self.name
        )
        self._engine_config = config.actor_rollout_ref.rollout.checkpoint_engine
        self.checkpoint_manager = None
        self.version: int | None = None

    @property
    def fixed(self) -> bool:
        """Whether the member is a fixed model (never refreshed, no weight version)."""
        return self.name == FIXED

    def connect(self, actor_wg: Any) -> None:
        """Give the stale copy its weight source, the actor worker group (a fixed model has none)."""
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.utils.config import omega_conf_to_dataclass

        if not self.fixed:
            self.checkpoint_manager = CheckpointEngineManager(
                config=omega_conf_to_dataclass(self._engine_config), actor_wg=actor_wg,
                replicas=self.manager.get_replicas()
            )

    def refresh(self, global_steps: int) -> dict:
        """Copy the actor's current weights (version ``global_steps``) into every stale replica."""
        metrics = self.checkpoint_manager.update_weights(global_steps) or {}
        self.version = global_steps
        logger.info("cross-policy: stale pool refreshed to weight version %d", global_steps)
        return metrics

    def get_client(self, client_cls: type[LLMServerClient] | None = None) -> LLMServerClient:
        """A server client of the stale replicas (same class as the current pool's)."""
        return self.manager.get_client(client_cls=client_cls)


class BesideSetup:
    """Runs ``launch`` in a thread once ``ready()`` holds, or once :meth:`release` is called, whichever comes first.

    verl's setup starts its processes one after another (each imports verl, seconds to tens of seconds); the stale
    pool's need nothing of verl's but the placement of its devices, so they start beside it.

    Args:
        ready: Polled every ``poll_s`` seconds until true.
        launch: What to run; its result (or error) is :meth:`result`'s.
        poll_s: Polling interval.
    """

    def __init__(self, ready: Callable[[], bool], launch: Callable[[], Any], poll_s: float = 0.05) -> None:
        self._ready = ready
        self._launch = launch
        self._poll_s = poll_s
        self._released = threading.Event()
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        # A daemon: a launch that outlives a failed setup must not hold the process at exit (Ray's shutdown ends it).
        self._thread = threading.Thread(target=self._run, name="agentrl-beside-setup", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._ready() and not self._released.wait(self._poll_s):
                pass
            if not self._cancelled.is_set():
                self._result = self._launch()
        except BaseException as e:  # handed to result()
            self._error = e
        finally:
            self._done.set()

    def release(self) -> None:
        """Launch now if not yet launched (the setup it waited beside has ended)."""
        self._released.set()

    def cancel(self) -> None:
        """Do not launch if not yet launched (the setup failed); a launch under way runs on, unawaited."""
        self._cancelled.set()
        self._released.set()

    def result(self) -> Any:
        """Release, wait for the launch and return its result or raise its error."""
        self.release()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


class CrossPolicyTrainerMixin:
    """Cross-policy sampling for a verl V1 ``PPOTrainer`` subclass; list it before the trainer class."""

    cross_policy: CrossPolicyConfig
    stale_pool: StalePool | None = None

    def _setup(self) -> None:
        self.cross_policy = agentrl_config(self.config).cross_policy
        if not self.cross_policy.enable:
            super()._setup()
            return
        # The stale pool's processes start beside verl's setup, as soon as verl has placed the actor's devices (its
        # placement first: on one card with a logical second device, the actor must get device 0).
        launch = BesideSetup(self._actor_placed, self._launch_stale_pool)
        try:
            super()._setup()
        except BaseException:
            launch.cancel()
            raise
        self.stale_pool = launch.result()
        replicas = len(self.llm_server_manager.get_replicas())
        if self.stale_pool.start_rank != replicas:
            raise RuntimeError(f"the stale pool's replicas start at rank {self.stale_pool.start_rank}, but verl runs "
                               f"{replicas} replicas of its own: their actor names would collide")
        self.stale_pool.connect(self.actor_rollout_wg)

    def _actor_pool(self) -> Any:
        """The resource pool of the actor's worker group, once verl has defined it (else None)."""
        manager = getattr(self, "resource_pool_manager", None)
        if manager is None:
            return None
        role = next((r for r in ACTOR_ROLES if r in self.mapping), None)
        return manager.resource_pool_dict.get(self.mapping[role]) if role is not None else None

    def _actor_placed(self) -> bool:
        pool = self._actor_pool()
        return pool is not None and pool.pgs is not None

    def _launch_stale_pool(self) -> StalePool:
        pool = self._actor_pool()
        replica_size = replica_world_size(self.config.actor_rollout_ref.rollout)
        return StalePool(
            self.config,
            num_replicas=self.cross_policy.stale_replicas,
            start_rank=pool.world_size // replica_size if pool is not None else 0,  # after verl's hybrid replicas
            model_path=self.cross_policy.fixed_model_path,
        )

    def get_llm_client(self) -> LLMServerClient:
        client = super().get_llm_client()
        if self.stale_pool is None:
            return client
        cp = self.cross_policy
        pool = self.stale_pool
        members = {CURRENT: client, pool.name: pool.get_client(type(client))}
        router = PolicyRouter(training_pool(cp.stale_ratio, pool.name), seed=cp.seed, sticky=cp.sticky)
        return PolicyPoolClient(self.config, members, router, fixed_members=[pool.name] if pool.fixed else [])

    @property
    def _stale_refreshed(self) -> bool:
        return self.stale_pool is not None and not self.stale_pool.fixed

    def on_init_end(self) -> None:
        super().on_init_end()
        if self._stale_refreshed:
            self.stale_pool.refresh(self.global_steps)  # start equal to the actor (also after a resume)

    def on_step_end(self) -> None:
        super().on_step_end()
        if self._stale_refreshed and stale_refresh_due(self.global_steps, self.cross_policy.stale_refresh_steps):
            from verl.utils.debug import marked_timer

            with marked_timer("update_stale_weights", self.timing_raw, color="red"):
                self.stale_pool.refresh(self.global_steps)

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> None:
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        if self.stale_pool is not None:
            metrics.update(self._cross_policy_metrics(batch, global_steps))

    def _cross_policy_metrics(self, batch: Any, global_steps: int) -> dict[str, float]:
        data = batch_fields(batch, "extra_fields", "rollout_log_probs")
        extras = data["extra_fields"]
        records = [EpisodeRecord.from_extra_fields(extra) for extra in extras]
        logs = [record.turn_log if record is not None else TurnLog() for record in records]
        metrics = cross_policy_metrics(
            [log.policies for log in logs],
            [record is not None and record.success for record in records],
            members=(CURRENT, self.stale_pool.name),
            turn_versions=[log.versions for log in logs],
            actor_version=global_steps - 1,  # the weights that generated this step's batch in synchronous mode
            turn_spans=[log.spans for log in logs],
            response_logprobs=data["rollout_log_probs"],
        )
        if self.stale_pool.fixed:
            return metrics  # a fixed model has no weight version
        # After this step's weight updates: the lag is in [0, stale_refresh_steps) (see cross_policy.stale_version).
        metrics["cross_policy/stale_version"] = float(self.stale_pool.version)
        metrics["cross_policy/stale_version_lag"] = float(global_steps - self.stale_pool.version)
        return metrics
