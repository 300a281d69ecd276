"""The ``agentrl_async`` V1 trainer mode: rollouts never wait for the trainer (AgentRL's asynchronous pipeline).

Select it with ``trainer.use_v1=true trainer.v1.trainer_mode=agentrl_async`` (options under ``+agentrl.async.*``,
see :class:`agentrl_verl.core.config.AsyncConfig`). It is verl's V1 trainer (``colocate_async`` semantics:
TransferQueue buffer, prompts fetched one at a time, partial-rollout-capable server client) with three changes:

1. **Continuous admission.** verl's async modes submit a whole batch of prompts per step (plus warm-up batches).
   Here an admission pump (a driver thread) keeps starting groups whenever :class:`AdmissionPacer` allows: the
   staleness bound and the buffer capacity, not the step boundary, decide. Episodes run while the trainer trains.
2. **Staleness-aware sampling.** :class:`StalenessReplayBuffer` takes a batch as soon as enough whole groups have
   finished, oldest first, and handles groups at the bound by ``stale_policy`` (:func:`plan_batch`). Versions are
   those of the turns (the agent loop records the weight version of every turn), not of the prompt.
3. **Weight updates between turns.** After each step the servers' admission gate closes, running generations
   finish on the old weights, the new weights load, and the gate reopens: episodes carry on across the update,
   each turn on one version. With ``interrupt: true`` running generations are aborted instead and resumed on the
   new weights (verl's partial rollout, through ``FullyAsyncLLMServerClient``).

Each step logs (prefix ``async/``): the per-turn lag histogram and version spans, dropped / kept-beyond-bound /
failed groups, rollout idle fraction (share of the pipeline's group slots unused, time-weighted), trainer idle
fraction (share of the step spent waiting for a batch), buffer depth, trajectories/s, tokens/s and turns resumed
after an interruption.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray
import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.utils.debug import marked_timer
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

from agentrl_verl.core.config import ASYNC_TRAINER_MODE, AsyncConfig, agentrl_config
from agentrl_verl.core.cross_policy import current_policy_versions
from agentrl_verl.core.episode import EpisodeRecord
from agentrl_verl.core.policy_pool import CrossPolicyTrainerMixin
from agentrl_verl.core.staleness import (
    AdmissionPacer,
    GroupState,
    LevelMeter,
    idle_fraction,
    plan_batch,
    staleness_metrics,
)
from agentrl_verl.core.trainer import SkipEmptyBatchMixin, TaskAwareTrainerMixin
from agentrl_verl.core.verl_seam import batch_fields

logger = logging.getLogger(__name__)

TRAINER_MODE = ASYNC_TRAINER_MODE
PARTITION = "train"
PREFIX = "async"
DRAIN_TIMEOUT_S = 120
"""Longest wait, after the last step, for running episodes to finish."""


def group_uid(key: str) -> str:
    """The group (prompt uid) of a TransferQueue key ``{uid}_{session}_{index}``, or of a prompt key ``{uid}``."""
    return key.split("_", 1)[0]


class Pipeline:
    """State shared by the admission pump (a thread), the replay buffer and the trainer (the main thread).

    One lock covers pacing decisions: the pump's look at TransferQueue and the submission that follows it, and the
    sampler's removal of groups together with the consumed count, so a group is never missed or counted twice.
    """

    def __init__(self, config: AsyncConfig, batch_groups: int, group_size: int):
        self.config = config
        self.batch_groups = batch_groups
        self.group_size = group_size
        self.capacity = config.capacity(batch_groups)
        self.pacer = AdmissionPacer(batch_groups, config.max_staleness, self.capacity, config.max_inflight)
        # Most groups that can run at once: the denominator of the rollout idle fraction.
        self.slots = min((config.max_staleness + 1) * batch_groups, self.capacity, config.max_inflight or self.capacity)
        self.lock = threading.Lock()
        self.admitted_version: dict[str, int] = {}
        self.counts = {"admitted": 0, "dropped": 0, "stale_kept": 0, "failed": 0}
        self.failure_limit = config.failure_limit(batch_groups)
        self.failed_since_batch = 0
        now = time.monotonic()
        self.running = LevelMeter(now)
        self.buffered = LevelMeter(now)

    def reset_windows(self) -> None:
        """Start the meters' windows now (training begins; the set-up time is not rollout idleness)."""
        with self.lock:
            now = time.monotonic()
            self.running.window(now)
            self.buffered.window(now)

    def snapshot(self) -> dict[str, Any]:
        """:func:`snapshot_groups` of the train partition as TransferQueue lists it now (call under :attr:`lock`)."""
        return snapshot_groups(tq.kv_list(PARTITION).get(PARTITION, {}), self.admitted_version)

    def count_failures(self, failed: int) -> None:
        """Count ``failed`` groups (an episode raised; their slots are refilled).

        Raises:
            RuntimeError: more than :attr:`failure_limit` groups failed since the last training batch. Groups that
                fail now and then are dropped and replaced; when every episode raises (a broken task, agent loop or
                environment), admitting more would go on forever without a step.
        """
        self.counts["failed"] += failed
        self.failed_since_batch += failed
        if self.failed_since_batch > self.failure_limit:
            raise RuntimeError(
                f"agentrl_async: {self.failed_since_batch} groups failed (an episode raised) since the last training "
                f"batch, more than agentrl.async.max_failed_groups={self.failure_limit}; the run stops instead of "
                "admitting more. Each episode's error is in the agent loop workers' log.")

    def on_batch(self) -> None:
        """A training batch was taken: failures count from here."""
        self.failed_since_batch = 0

    def observe(self, running: int, finished: int) -> None:
        now = time.monotonic()
        self.running.set(running, now)
        self.buffered.set(finished, now)


def grouped(items: Mapping[str, Any]) -> dict[str, Any]:
    """``items`` (TransferQueue keys of the train partition) with each group's together, groups in order of arrival.

    Trajectories arrive as their episodes end, the groups' interleaved; verl cuts the batch into micro-batches in order
    and pads each to its longest sample. A group's samples share their opening, so with one group per micro-batch
    (``ppo_micro_batch_size_per_gpu`` = ``rollout.n``) the short tasks' samples are not padded to the long ones' (for
    the demo's mix of calc, os and db groups about half the padded tokens). The loss is the same in any order.
    """
    groups: dict[str, dict[str, Any]] = {}
    for key, tag in items.items():
        groups.setdefault(group_uid(key), {})[key] = tag
    return {key: tag for members in groups.values() for key, tag in members.items()}


def snapshot_groups(items: Mapping[str, Mapping[str, Any]], admitted_version: Mapping[str, int]) -> dict[str, Any]:
    """Sort a TransferQueue listing of the train partition into group states.

    Args:
        items: ``key -> tag`` of the partition: prompt keys (tag ``is_prompt``, ``status``) and trajectory keys
            (tag ``min_global_steps`` = oldest turn version, written when the trajectory is stored).
        admitted_version: version at admission of each group the pump started.

    Returns:
        ``groups`` (:class:`GroupState` of every running or finished group), ``failed`` (uids of failed groups),
        ``running`` and ``finished`` counts.
    """
    oldest_turn: dict[str, int] = {}
    for key, tag in items.items():
        if not tag.get("is_prompt", False) and tag.get("min_global_steps") is not None:
            uid = group_uid(key)
            oldest_turn[uid] = min(int(tag["min_global_steps"]), oldest_turn.get(uid, int(tag["min_global_steps"])))
    groups, failed = [], []
    for key, tag in items.items():
        if not tag.get("is_prompt", False):
            continue
        status = tag.get("status")
        # Groups admitted before this trainer started (resumed checkpoints) fall back to their submission step.
        admitted = admitted_version.get(key, max(0, int(tag.get("global_steps", 1)) - 1))
        if status == "failure":
            failed.append(key)
        elif status == "finished":
            # No turn of the trained policy is older than the group's admission. A trajectory whose turns all came
            # from a cross-policy pool member carries its submission step's version instead, which can be older.
            groups.append(GroupState(key, max(oldest_turn.get(key, admitted), admitted), finished=True))
        else:  # pending or running
            groups.append(GroupState(key, admitted, finished=False))
    running = sum(not g.finished for g in groups)
    return {"groups": groups, "failed": failed, "running": running, "finished": len(groups) - running}


class AdmissionPump(threading.Thread):
    """Keeps starting groups whenever the pacer allows, until stopped.

    Args:
        pipeline: The shared state.
        submit: Starts ``k`` new groups (fetches prompts, registers them in TransferQueue, dispatches them to
            the agent loop workers) and returns their uids.
    """

    def __init__(self, pipeline: Pipeline, submit: Callable[[int], list[str]]):
        super().__init__(name="agentrl-admission", daemon=True)
        self.pipeline = pipeline
        self.submit = submit
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                self.tick()
                self._stop_event.wait(self.pipeline.config.poll_interval)
        except BaseException as error:  # surfaced by the trainer's next sample(); a silent stall is worse
            logger.exception("agentrl_async: the admission pump failed")
            self.error = error

    def tick(self) -> int:
        """One look at the rollout state; returns how many groups were admitted."""
        p = self.pipeline
        with p.lock:
            state = p.snapshot()
            p.observe(state["running"], state["finished"])
            quota = p.pacer.quota(state["running"], state["finished"])
            if quota <= 0:
                return 0
            version = p.pacer.version
            uids = self.submit(quota)
            for uid in uids:
                p.admitted_version[uid] = version
            p.counts["admitted"] += len(uids)
            p.observe(state["running"] + len(uids), state["finished"])
        return len(uids)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=60)


class StalenessReplayBuffer(ReplayBufferAsync):
    """verl's async replay buffer, sampling the train partition by :func:`plan_batch`.

    Validation (partition ``val``) keeps verl's behaviour. Set :attr:`pipeline` and :attr:`pump` before training.
    """

    pipeline: Pipeline | None = None
    pump: AdmissionPump | None = None

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        if partition_id != PARTITION or self.pipeline is None:
            return super().sample(global_steps, partition_id, batch_size)
        p = self.pipeline
        if batch_size != p.batch_groups:
            raise ValueError(f"agentrl_async samples {p.batch_groups} groups per step, asked for {batch_size}")
        trained_version = global_steps - 1
        metrics = {f"{PREFIX}/groups/dropped": 0.0, f"{PREFIX}/groups/failed": 0.0, f"{PREFIX}/groups/stale_kept": 0.0}
        while True:
            if self.pump is not None and self.pump.error is not None:
                raise RuntimeError("agentrl_async: the admission pump stopped") from self.pump.error
            with p.lock:
                self._sync_metadata_from_transfer_queue()
                state = snapshot_groups(self.partitions[partition_id] | self._prompt_tags(partition_id),
                                        p.admitted_version)
                plan = plan_batch(state["groups"], trained_version, p.batch_groups, p.config.max_staleness,
                                  p.config.stale_policy)
                # Failed groups (an episode raised) and dropped ones leave; the pump refills their slots.
                removed = set(state["failed"]) | set(plan.drop)
                if removed:
                    self._clear_groups(partition_id, removed)
                    self._forget(removed)
                    p.counts["dropped"] += len(plan.drop)
                    metrics[f"{PREFIX}/groups/failed"] += len(state["failed"])
                    metrics[f"{PREFIX}/groups/dropped"] += len(plan.drop)
                    p.count_failures(len(state["failed"]))
                if plan.ready:
                    batch = self._materialize_batch(partition_id, list(plan.take),
                                                    grouped(self.partitions[partition_id]))
                    self._forget(plan.take)
                    p.pacer.on_consumed(len(plan.take))
                    p.on_batch()
                    p.counts["stale_kept"] += plan.stale_kept
                    metrics[f"{PREFIX}/groups/stale_kept"] = float(plan.stale_kept)
                    p.observe(state["running"], state["finished"] - len(plan.take) - len(plan.drop))
                    return batch, metrics
            time.sleep(p.config.poll_interval)

    def _prompt_tags(self, partition_id: str) -> dict[str, dict]:
        """Prompt tags from the synced metadata, in the shape of a TransferQueue listing."""
        tags: dict[str, dict] = {}
        for status, keys in (("pending", self.pending_keys), ("running", self.running_keys),
                             ("finished", self.finished_keys), ("failure", self.failure_keys)):
            for uid in keys[partition_id]:
                tags[uid] = {"is_prompt": True, "status": status,
                             "global_steps": self.prompt_global_steps[partition_id].get(uid, 1)}
        return tags

    def _forget(self, uids) -> None:
        for uid in uids:
            self.pipeline.admitted_version.pop(uid, None)


class AsyncPipelineTrainer(SkipEmptyBatchMixin, PPOTrainer):
    """verl V1 trainer running AgentRL's asynchronous pipeline (see the module docstring)."""

    def __init__(self, config):
        # Before verl's constructor, which builds the replay buffer around the pipeline.
        self.async_config = agentrl_config(config).async_
        group_size = int(config.actor_rollout_ref.rollout.n)
        self.pipeline = Pipeline(self.async_config, int(config.data.train_batch_size), group_size)
        self.pump: AdmissionPump | None = None
        super().__init__(config)
        if self.parameter_sync_step != 1:
            raise ValueError(f"{TRAINER_MODE} updates the weights after every step; parameter_sync_step must be 1")
        if stale_turns_uncorrected(self.async_config.max_staleness, config.algorithm.get("rollout_correction")):
            logger.warning(
                "%s with max_staleness=%d and no behaviour-policy correction trains stale turns as on-policy: set "
                "algorithm.rollout_correction.bypass_mode=true (PPO ratio against each token's behaviour log-prob) "
                "or algorithm.rollout_correction.rollout_is=token", TRAINER_MODE, self.async_config.max_staleness)

    def _build_replay_buffer(self) -> StalenessReplayBuffer:
        sampler = self.config.trainer.v1.sampler
        buffer = StalenessReplayBuffer(
            trainer_mode=self.trainer_mode,
            trainer_config=self.config.trainer.v1.get(self.trainer_mode, {}),
            max_off_policy_threshold=None,  # the staleness bound is ours (agentrl.async.max_staleness)
            max_off_policy_strategy="drop",
            sampler_kwargs=sampler.sampler_kwargs,
            refill_fn=None,  # the admission pump refills evicted slots
        )
        buffer.pipeline = self.pipeline
        return buffer

    def get_llm_client(self):
        # Resumes generations aborted at a weight update (interrupt=true) transparently to the agent loop.
        return self.llm_server_manager.get_client(client_cls=FullyAsyncLLMServerClient)

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def fit(self, agent_loop_manager):
        completed = False
        try:
            super().fit(agent_loop_manager)
            completed = True
        finally:
            if self.pump is not None:
                self.pump.stop()
                if completed:
                    self._drain()

    def _drain(self) -> None:
        """Let the episodes still running after the last step finish, so that each closes its environment session
        (a session left open would hold a worker slot until the controller's idle timeout)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while True:
            with self.pipeline.lock:
                state = self.pipeline.snapshot()
            if state["running"] == 0:
                logger.info("agentrl_async: run over; %d finished groups were not trained", state["finished"])
                return
            if time.monotonic() > deadline:
                logger.warning("agentrl_async: %d groups still running %ds after the last step; their environment "
                               "sessions end at the controller's idle timeout", state["running"], DRAIN_TIMEOUT_S)
                return
            time.sleep(self.async_config.poll_interval)

    def on_init_end(self):
        self.checkpoint_manager.update_weights(self.global_steps)
        pacer = self.pipeline.pacer
        pacer.on_version(self.global_steps)
        pacer.on_consumed(self.global_steps * pacer.batch_groups)
        pacer.total_groups = self.total_training_steps * pacer.batch_groups  # known once verl built its dataloader

    def on_train_begin(self):
        self.pump = AdmissionPump(self.pipeline, self._start_groups)
        self.replay_buffer.pump = self.pump
        self.pipeline.reset_windows()
        self._last_step_end = time.monotonic()
        self.pump.start()

    def _start_groups(self, count: int) -> list[str]:
        batch = self._next_train_batch(count)
        self._submit_batch_to_rollout(batch)
        return [str(uid) for uid in batch["uid"]]

    def prepare_step(self) -> dict:
        return {}  # no batch per step: the admission pump keeps the pipeline full

    def on_sample_begin(self):
        self._sample_start = time.monotonic()

    def on_sample_end(self):
        self.timing_raw["async/wait_for_batch"] = time.monotonic() - self._sample_start

    def on_step_end(self):
        with marked_timer("update_weights", self.timing_raw, color="red"):
            if self.async_config.interrupt:
                self.checkpoint_manager.abort_replicas()
            else:
                self._pause_replicas()
            self.checkpoint_manager.update_weights(self.global_steps)
            with self.pipeline.lock:
                self.pipeline.pacer.on_version(self.global_steps)
            self.checkpoint_manager.resume_generation_replicas()

    def _pause_replicas(self) -> None:
        """Close every server's admission gate and let running generations finish on the current weights."""
        servers = [server for replica in self.checkpoint_manager.replicas for server in replica.servers]
        ray.get([server.pause_generation.remote() for server in servers])

    def _save_checkpoint(self):
        # The pump iterates the train dataloader; hold it while the dataloader state is saved.
        with self.pipeline.lock:
            super()._save_checkpoint()

    # ---- metrics -----------------------------------------------------------------------------------------

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        metrics.update(self._pipeline_metrics(batch, timing_raw, global_steps))

    def _pipeline_metrics(self, batch: KVBatchMeta, timing_raw: dict, global_steps: int) -> dict[str, float]:
        p = self.pipeline
        rows = [tag for tag in batch.tags if not tag.get("is_padding", False)]
        extras = batch_fields(batch, "extra_fields")["extra_fields"]
        records = [EpisodeRecord.from_extra_fields(extra) for extra in extras]
        turn_versions = [trained_turn_versions(record) for record in records]
        metrics = staleness_metrics(
            turn_versions, global_steps - 1, p.config.max_staleness, prefix=f"{PREFIX}/staleness"
        )
        with p.lock:  # the pump updates the meters under the lock too, so time never goes back for them
            now = time.monotonic()
            running_mean, _ = p.running.window(now)
            buffered_mean, buffered_max = p.buffered.window(now)
            counts = dict(p.counts)
        interval = max(now - self._last_step_end, 1e-9)
        self._last_step_end = now
        metrics.update({
            f"{PREFIX}/version": float(global_steps),
            f"{PREFIX}/rollout_idle_fraction": idle_fraction(running_mean, p.slots),
            f"{PREFIX}/trainer_idle_fraction": min(1.0, timing_raw.get("async/wait_for_batch", 0.0) / interval),
            f"{PREFIX}/running_groups/mean": running_mean,
            f"{PREFIX}/buffer_depth/mean": buffered_mean,
            f"{PREFIX}/buffer_depth/max": buffered_max,
            f"{PREFIX}/throughput/trajectories_per_s": len(rows) / interval,
            f"{PREFIX}/throughput/tokens_per_s": sum(int(tag.get("seq_len", 0)) for tag in rows) / interval,
            f"{PREFIX}/step_interval_s": interval,
            # Turns aborted at a weight update and finished on the new weights (interrupt: true).
            f"{PREFIX}/resumed_turns": float(sum(record.resumed_turns for record in records if record is not None)),
            **{f"{PREFIX}/total/{name}": float(value) for name, value in counts.items()},
        })
        return metrics


class AgentRLAsyncTrainer(CrossPolicyTrainerMixin, TaskAwareTrainerMixin, AsyncPipelineTrainer):
    """The ``agentrl_async`` mode: the asynchronous pipeline with task-aware advantages, per-task episode metrics
    and (when ``agentrl.cross_policy.enable``) cross-policy sampling, as ``agentrl_sync`` has them."""

    verl_mode = "colocate_async"  # verl's async semantics: TransferQueue checkpoints, prompts fetched one at a time


def stale_turns_uncorrected(max_staleness: int, rollout_correction: Mapping[str, Any] | None) -> bool:
    """Whether turns up to ``max_staleness`` updates old would be trained without behaviour-policy correction.

    verl's decoupled mode (``bypass_mode: false``) recomputes ``old_log_probs`` with the current actor, so a stale
    turn gets a PPO ratio of 1 at the update: trained as on-policy and never clipped, unless ``rollout_is`` weighs
    it against its behaviour log-probs.
    """
    correction = rollout_correction or {}
    return max_staleness > 0 and not correction.get("bypass_mode") and not correction.get("rollout_is")


def trained_turn_versions(record: EpisodeRecord | None) -> list[int]:
    """The weight versions of an episode's turns generated by the trained policy (a cross-policy pool member's turns
    are off-policy by design, counted by the ``cross_policy/*`` metrics instead); none for a row without a record."""
    if record is None:
        return []
    return current_policy_versions(record.turn_log.versions, record.turn_log.policies)


def register() -> None:
    """Register the ``agentrl_async`` trainer mode with verl."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer

    if TRAINER_REGISTRY.get(TRAINER_MODE) is not AgentRLAsyncTrainer:
        register_trainer(TRAINER_MODE)(AgentRLAsyncTrainer)


register()  # importing the module registers it: agentrl_verl.plugin imports it with its verl package
