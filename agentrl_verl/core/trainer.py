"""verl wiring of the AgentRL training step: the ``task_norm_grpo`` estimator and the ``agentrl_sync`` trainer.

verl hands a registered advantage estimator only the rewards, the response mask and the group ids
(``uid``), never the task of a sample. The ``agentrl_sync`` V1 trainer mode (verl's ``sync`` mode plus
two things) closes that gap:

- before verl computes advantages it reads every row's ``data_source`` from TransferQueue, in the same
  row order verl uses, and exposes it with the ``agentrl.task_adv_norm`` option to the estimator for the
  duration of that call (:func:`batch_tasks`);
- after each step it logs per-task episode metrics (reward, success rate, turns, status counts, tokens,
  environment latency) from the extras the ``agentrl_agent`` loop writes, through verl's tracking;
- before the first step it waits until verl's agent loop workers have started, so that their start-up is not
  counted as the first step's time (``agentrl/agent_loop_ready_s``, logged with step 1, says how long that took);
- its replay buffer looks for the finished batch every ``agentrl.async.poll_interval`` (0.1 s) instead of verl's
  2 s, which rounded every step's generation up to the next multiple of 2 s.

Use both together::

    algorithm.adv_estimator=task_norm_grpo trainer.use_v1=true trainer.v1.trainer_mode=agentrl_sync
    +agentrl.task_adv_norm=token   # off | token (= on, upstream) | trajectory

The estimator's maths lives in :mod:`agentrl_verl.core.advantage`; this module only moves data to it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import ray
import torch
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est
from verl.trainer.ppo.v1 import PPOTrainerSync
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer

from agentrl_verl.core.advantage import task_norm_grpo_advantage
from agentrl_verl.core.config import ESTIMATOR_NAME, AgentRLConfig, TaskAdvNorm, validate_run_config
from agentrl_verl.core.env_launch import start_env_stack
from agentrl_verl.core.episode import EpisodeRecord
from agentrl_verl.core.policy_pool import CrossPolicyTrainerMixin
from agentrl_verl.core.verl_seam import batch_fields

logger = logging.getLogger(__name__)

TRAINER_MODE = "agentrl_sync"


@dataclass(frozen=True)
class _BatchTasks:
    task: np.ndarray
    mode: TaskAdvNorm


_BATCH_TASKS: contextvars.ContextVar[_BatchTasks | None] = contextvars.ContextVar("agentrl_batch_tasks", default=None)


@contextlib.contextmanager
def batch_tasks(task: Sequence[Any] | np.ndarray, mode: TaskAdvNorm | str) -> Iterator[None]:
    """Make the rows' tasks (in verl's row order) and the normalisation mode visible to the estimator."""
    token = _BATCH_TASKS.set(_BatchTasks(np.asarray(task, dtype=object), TaskAdvNorm.parse(mode)))
    try:
        yield
    finally:
        _BATCH_TASKS.reset(token)


def compute_task_norm_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl estimator ``task_norm_grpo``: GRPO group advantage, then per-task normalisation.

    Args:
        token_level_rewards: ``(B, T)`` rewards (the outcome reward sits on the last response token).
        response_mask: ``(B, T)`` loss mask.
        index: ``B`` group ids (verl's ``uid``).
        config: ``config.algorithm``; ``norm_adv_by_std_in_grpo`` is honoured as in verl's ``grpo``.
        **kwargs: Further estimator arguments verl may pass (ignored).

    Returns:
        ``(advantages, returns)``, both the same ``(B, T)`` tensor, as verl's ``grpo``.

    Raises:
        RuntimeError: called outside the ``agentrl_sync`` trainer, which supplies the tasks.
    """
    if index is None:
        raise ValueError(f"{ESTIMATOR_NAME} needs the group ids (uid) of the batch")
    tasks = _BATCH_TASKS.get()
    if tasks is None:
        raise RuntimeError(
            f"algorithm.adv_estimator={ESTIMATOR_NAME} needs each sample's task, which only the V1 trainer mode "
            f"'{TRAINER_MODE}' supplies: set trainer.use_v1=true trainer.v1.trainer_mode={TRAINER_MODE}"
        )
    if len(tasks.task) != token_level_rewards.shape[0]:
        raise RuntimeError(f"{len(tasks.task)} tasks for a batch of {token_level_rewards.shape[0]} rows")
    norm_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    advantages = task_norm_grpo_advantage(token_level_rewards, response_mask, index, tasks.task, tasks.mode,
                                          norm_by_std=norm_by_std)
    return advantages, advantages


# ---- per-task episode metrics ------------------------------------------------------------------------


TAIL_FIELDS = ("turns", "env_latency_s", "generate_s")
"""Episode fields whose 90th percentile per task is a metric too: where an episode's time goes, and its tail."""


def episode_metrics(extras: Sequence[dict[str, Any] | None], prefix: str = "agentrl") -> dict[str, float]:
    """Per-task and overall metrics of finished episodes, from the ``agentrl_agent`` extras.

    Args:
        extras: One ``extra_fields`` dict per trajectory; rows not produced by ``agentrl_agent`` (no
            ``task`` key) are skipped.
        prefix: Metric name prefix.

    Returns:
        ``{prefix}/{task}/{name}`` and ``{prefix}/all/{name}`` for name in ``reward``, ``success_rate``
        (:func:`~agentrl_verl.core.episode.is_success`), ``turns``, ``generated_tokens``,
        ``env_tokens``, ``env_latency_s``, ``generate_s`` (means), ``turns_p90``, ``env_latency_s_p90``,
        ``generate_s_p90`` (90th percentiles over the episodes: the tail that a synchronous step waits for),
        ``episodes``, ``env_retries`` (attempts the environment lost, played again), ``env_unavailable_s`` (the
        longest an episode waited for the environment) and ``status/<status>`` (counts, spaces as ``_``).
    """
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for record in map(EpisodeRecord.from_extra_fields, extras):
        if record is not None:
            groups[record.task].append(record)
            groups["all"].append(record)
    metrics: dict[str, float] = {}
    for task, rows in groups.items():
        base = f"{prefix}/{task}"
        metrics[f"{base}/episodes"] = float(len(rows))
        metrics[f"{base}/success_rate"] = float(np.mean([r.success for r in rows]))
        for name in ("reward", "turns", "generated_tokens", "env_tokens", "env_latency_s", "generate_s"):
            metrics[f"{base}/{name}"] = float(np.mean([float(getattr(r, name)) for r in rows]))
        for name in TAIL_FIELDS:
            metrics[f"{base}/{name}_p90"] = float(np.percentile([float(getattr(r, name)) for r in rows], 90))
        # Environment losses: episodes played again on the same prompt, and the longest wait for the environment.
        metrics[f"{base}/env_retries"] = float(sum(r.env_retries for r in rows))
        metrics[f"{base}/env_unavailable_s"] = float(max(r.env_unavailable_s for r in rows))
        for status, count in Counter(r.status for r in rows).items():
            metrics[f"{base}/status/{status.replace(' ', '_')}"] = float(count)
    return metrics


# ---- the trainer mode --------------------------------------------------------------------------------


def wait_for_start_model(path: str, timeout_s: float, poll_s: float = 0.5, report_every_s: float = 30.0) -> float:
    """Wait up to ``timeout_s`` for the model directory ``path`` to hold its ``config.json``; returns the seconds
    waited. A writer makes the directory appear whole (written elsewhere, then renamed), as the demo's warm-up does.

    Raises:
        TimeoutError: the directory did not appear in time (the message names ``agentrl.start_model_wait_s``).
    """
    marker = Path(path) / "config.json"
    started = reported = time.monotonic()
    while timeout_s > 0 and not marker.exists():
        now = time.monotonic()
        if now - started >= timeout_s:
            raise TimeoutError(f"the start model {path} did not appear within agentrl.start_model_wait_s="
                               f"{timeout_s:g} s; whatever writes it (the demo's warm-up) stopped or is slower")
        if now - reported >= report_every_s:
            # Printed, as verl prints its steps: the line reaches the driver's output (INFO logs of verl's processes
            # do not), where the demo's stall watchdog sees the run alive during a long warm-up and evaluation.
            print(f"waiting for the start model {path} ({now - started:.0f} s so far)", flush=True)
            reported = now
        time.sleep(poll_s)
    return time.monotonic() - started


class TaskAwareTrainerMixin:
    """Validates the ``agentrl`` config, adds the tasks to the advantage step and per-task episode metrics to a V1
    trainer, and starts training only once the agent loop workers are up.

    verl compares ``trainer_mode`` with literal names (``"sync"``) to pick its replay buffer and refill
    policy; a subclass names the built-in mode it extends in :attr:`verl_mode`, and verl sees that name
    (and reads that mode's config block), while the registered name is kept in :attr:`registered_mode`.
    """

    verl_mode: ClassVar[str]
    agentrl: AgentRLConfig
    _agent_loop_ready_s: float | None = None
    _env_stack: Any = None  # the run's own environment stack (agentrl.env.launch=ray)

    def __init__(self, config: Any) -> None:
        # On the driver, before verl's constructor and any worker: a bad agentrl.* key stops the launch here.
        self.agentrl = validate_run_config(config)
        # agentrl.env.launch=ray: the stack comes up before verl creates the agent loop workers that read its URL.
        self._env_stack = start_env_stack(config, self.agentrl)
        with self._stopping_env_stack_on_error():
            super().__init__(config)

    @contextlib.contextmanager
    def _stopping_env_stack_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self._stop_env_stack()
            raise

    def _stop_env_stack(self) -> None:
        if self._env_stack is not None:
            self._env_stack.stop()
            self._env_stack = None

    def init(self) -> None:
        with self._stopping_env_stack_on_error():
            super().init()

    def _setup(self) -> None:
        # Before verl's setup, the first to read the model (its tokenizer, then the workers' weights).
        waited = wait_for_start_model(self.config.actor_rollout_ref.model.path, self.agentrl.start_model_wait_s)
        if waited >= 1:
            print(f"the start model appeared after {waited:.0f} s", flush=True)
        super()._setup()

    @property
    def trainer_mode(self) -> str:
        return self.verl_mode

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.registered_mode = value

    def fit(self, agent_loop_manager: Any) -> None:
        # verl creates the agent loop workers without waiting for them: their start-up (a process importing verl,
        # tens of seconds on a busy CPU) would land in the first step's time, in every trainer mode alike.
        started = time.monotonic()
        ray.get([worker.__ray_ready__.remote() for worker in getattr(agent_loop_manager, "agent_loop_workers", [])])
        self._agent_loop_ready_s = time.monotonic() - started
        try:
            super().fit(agent_loop_manager)
        finally:
            self._stop_env_stack()

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        # Every row, padding included: the estimator sees verl's whole batch in its row order.
        tasks = batch_fields(batch, "data_source", padding=True)["data_source"]
        with batch_tasks(tasks, self.agentrl.task_adv_norm):
            return super()._compute_advantage(batch, metrics)

    def _compute_metrics(self, batch: KVBatchMeta, metrics: dict, timing_raw: dict, global_steps: int,
                         epoch: int) -> None:
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        metrics.update(episode_metrics(batch_fields(batch, "extra_fields")["extra_fields"]))
        if self._agent_loop_ready_s is not None:  # the wait before the first step, logged with it
            metrics["agentrl/agent_loop_ready_s"] = self._agent_loop_ready_s
            self._agent_loop_ready_s = None


class NothingToTrain(Exception):
    """Raised inside verl's step for a sampled batch without a single loss token; carries the batch."""

    def __init__(self, batch: KVBatchMeta) -> None:
        super().__init__(f"{len(batch.keys)} rows, none with a loss token")
        self.batch = batch


def has_loss_token(batch: KVBatchMeta) -> bool:
    """Whether any row of ``batch`` has a response token in the loss (rows of failed episodes are all masked)."""
    return any(any(row) for row in batch_fields(batch, "response_mask")["response_mask"])


class SkipEmptyBatchMixin:
    """Skips the update of a batch whose every row is masked (every episode ended ``task error``).

    verl 0.9.1 stops the run on such a batch ("response_mask must contain at least one valid token"). Here the step
    goes on without an update: the episodes' own metrics are logged, verl's training metrics are left out, and
    ``agentrl/skipped_batches`` (1 for the step) says what happened. Sits just above verl's trainer class in the MRO,
    so that every mixin above it still sees the skipped step.
    """

    _skipped_keys: frozenset = frozenset()  # the rows of this step's skipped batches

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        try:
            return super()._step_once(metrics, timing_raw, sample_batch_size)
        except NothingToTrain as empty:
            logger.warning("step %d: every episode of the batch failed (%s); no update this step",
                           self.global_steps, empty)
            metrics["agentrl/skipped_batches"] = metrics.get("agentrl/skipped_batches", 0.0) + 1.0
            self._skipped_keys = self._skipped_keys | set(empty.batch.keys)
            return empty.batch

    def _balance_batch(self, batch: KVBatchMeta, metrics: dict, *args: Any, **kwargs: Any) -> KVBatchMeta:
        # verl's first step after sampling the batch (and scoring it): nothing of the update has run yet.
        if not has_loss_token(batch):
            raise NothingToTrain(batch)
        return super()._balance_batch(batch, metrics, *args, **kwargs)

    def _compute_metrics(self, batch: KVBatchMeta, metrics: dict, timing_raw: dict, global_steps: int,
                         epoch: int) -> None:
        skipped, self._skipped_keys = self._skipped_keys, frozenset()
        metrics.setdefault("agentrl/skipped_batches", 0.0)
        if not skipped:
            super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
            return
        trained = [i for i, key in enumerate(batch.keys) if key not in skipped]
        if trained:
            super()._compute_metrics(KVBatchMeta(partition_id=batch.partition_id, keys=[batch.keys[i] for i in trained],
                                                 tags=[batch.tags[i] for i in trained]),
                                     metrics, timing_raw, global_steps, epoch)
        else:
            metrics.update({"training/global_step": global_steps, "training/epoch": epoch,
                             **{f"timing_s/{name}": value for name, value in timing_raw.items()}})


class AgentRLSyncTrainer(CrossPolicyTrainerMixin, TaskAwareTrainerMixin, SkipEmptyBatchMixin, PPOTrainerSync):
    """verl's synchronous V1 trainer with task-aware advantages, per-task episode metrics and (when
    ``agentrl.cross_policy.enable``) cross-policy sampling."""

    verl_mode = "sync"

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        # verl's buffer sleeps 2 s between looks for the finished batch: each step then waited for its generation
        # rounded up to a multiple of 2 s, about 1 s lost per step (an eighth of a calc step), where the async trainer
        # looks every poll_interval.
        buffer.poll_interval = self.agentrl.async_.poll_interval
        return buffer


def register() -> None:
    """Register the ``task_norm_grpo`` estimator and the ``agentrl_sync`` trainer mode with verl."""
    if ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR_NAME) is not compute_task_norm_grpo_advantage:
        register_adv_est(ESTIMATOR_NAME)(compute_task_norm_grpo_advantage)
    if TRAINER_REGISTRY.get(TRAINER_MODE) is not AgentRLSyncTrainer:
        register_trainer(TRAINER_MODE)(AgentRLSyncTrainer)


register()  # importing the module registers it: agentrl_verl.plugin imports it with its verl package
