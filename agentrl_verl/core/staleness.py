"""Bounded staleness for the asynchronous generation-training pipeline, as pure Python.

Vocabulary (the same in code, config keys and metrics):

- **version**: the number of weight updates the rollout engines have received. The trainer's step ``t``
  (1-based, verl's ``global_steps``) updates the policy of version ``t - 1`` and then pushes version ``t``.
- **group**: the ``n`` trajectories of one prompt; admitted, buffered, trained and dropped as a whole.
- **lag** of a turn trained at step ``t``: ``(t - 1) - v`` where ``v`` is the version that generated it. A
  group's lag is the lag of its oldest turn; lag 0 is on-policy.

Three small pieces, each testable on its own:

1. :class:`AdmissionPacer` - how many new groups may start now. A group admitted at version ``v`` that is
   trained in admission order lands in step ``ceil(position / B)``, so admitting only while
   ``admitted <= (v + K + 1) * B`` bounds its lag by ``K``: staleness is bounded by pacing admission,
   not by discarding finished work. The buffer capacity bounds the groups in flight plus finished.
   With ``K = 0`` this degenerates to synchronous on-policy training.
2. :func:`plan_batch` - which finished groups the trainer takes now. Episodes finish out of order
   (long tails), so a group can still reach the bound; ``stale_policy`` decides: ``wait`` trains the
   oldest groups first and holds a step until the groups that must be in it to meet their deadline have
   finished (the bound then holds exactly), ``drop`` discards finished groups beyond the bound (their
   slots are refilled), ``keep`` trains them anyway (counted; the trainer then requires verl's
   importance-weight correction against the behaviour log-probs, ``algorithm.rollout_correction``).
3. Measurement - :func:`staleness_metrics` (per-turn lag histogram, versions per trajectory) and
   :class:`LevelMeter` (time-weighted in-flight and buffer levels for idle fractions).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agentrl_verl.core.config import StalePolicy


class AdmissionPacer:
    """Decides how many new groups may start, from the version and the groups the trainer consumed.

    Args:
        batch_groups: ``B``, groups per training step.
        max_staleness: ``K``.
        capacity: most groups outstanding (running plus finished, untrained) at once.
        max_inflight: most groups running at once, or ``None``.
        total_groups: the groups the whole run trains (steps times ``B``), or ``None`` for no end. None are admitted
            beyond it: the last ``K`` steps would otherwise generate groups no step trains, on cores the trainer
            needs, and the run would wait for them at its end.
    """

    def __init__(self, batch_groups: int, max_staleness: int, capacity: int, max_inflight: int | None = None,
                 total_groups: int | None = None):
        if batch_groups < 1:
            raise ValueError(f"batch_groups={batch_groups} must be >= 1")
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.capacity = capacity
        self.max_inflight = max_inflight
        self.total_groups = total_groups
        self.version = 0
        self.consumed = 0

    def on_consumed(self, groups: int) -> None:
        """The trainer took ``groups`` groups for its update (dropped groups are never consumed)."""
        self.consumed += groups

    def on_version(self, version: int) -> None:
        """The rollout engines now run weights of ``version``."""
        if version < self.version:
            raise ValueError(f"weight version went back from {self.version} to {version}")
        self.version = version

    def quota(self, running: int, finished: int) -> int:
        """How many groups may be admitted now, given ``running`` and ``finished`` (untrained) groups."""
        outstanding = running + finished
        # A new group takes position consumed + outstanding + 1 in training order; it must be trained no
        # later than step version + K + 1, i.e. position <= (version + K + 1) * B.
        by_staleness = (self.version + self.max_staleness + 1) * self.batch_groups - self.consumed - outstanding
        limits = [by_staleness, self.capacity - outstanding]
        if self.max_inflight is not None:
            limits.append(self.max_inflight - running)
        if self.total_groups is not None:
            # Dropped groups are neither consumed nor outstanding, so their slots are refilled.
            limits.append(self.total_groups - self.consumed - outstanding)
        return max(0, min(limits))


@dataclass(frozen=True)
class GroupState:
    """What the planner needs to know about one outstanding group.

    Attributes:
        uid: the group's id (verl's prompt ``uid``).
        version: the oldest version among its generated turns once finished; while running, the version
            at admission (a lower bound of every turn it will generate).
        finished: all ``n`` episodes of the group have ended.
    """

    uid: str
    version: int
    finished: bool


@dataclass(frozen=True)
class BatchPlan:
    """The planner's decision for one look at the buffer.

    Attributes:
        take: the groups to train now, oldest first; empty while the batch is not ready.
        drop: finished groups to discard now (``drop`` policy), whether or not a batch is ready.
        stale_kept: how many of ``take`` are beyond the bound (``keep`` policy, or ``wait`` when pacing
            was bypassed).
        waiting_on: running groups at the bound that the ``wait`` policy holds the step for.
    """

    take: tuple[str, ...]
    drop: tuple[str, ...] = ()
    stale_kept: int = 0
    waiting_on: int = 0

    @property
    def ready(self) -> bool:
        return bool(self.take)


def plan_batch(
    groups: Iterable[GroupState],
    trained_version: int,
    batch_groups: int,
    max_staleness: int,
    policy: StalePolicy,
) -> BatchPlan:
    """Choose the groups for the next update of the policy of ``trained_version``.

    Groups are taken oldest version first (ties keep the input order, i.e. admission order).

    Args:
        groups: every outstanding group (running and finished).
        trained_version: the version the update starts from (``global_steps - 1`` in verl).
        batch_groups: ``B``, groups per update.
        max_staleness: ``K``.
        policy: the stale policy.

    Returns:
        The plan; ``take`` holds exactly ``batch_groups`` uids when ready.
    """
    groups = list(groups)
    finished = sorted((g for g in groups if g.finished), key=lambda g: g.version)
    drop: tuple[str, ...] = ()
    if policy is StalePolicy.DROP:
        drop = tuple(g.uid for g in finished if trained_version - g.version > max_staleness)
        finished = [g for g in finished if trained_version - g.version <= max_staleness]
    elif policy is StalePolicy.WAIT:
        waiting_on = _groups_to_wait_for(groups, trained_version, batch_groups, max_staleness)
        if waiting_on:
            return BatchPlan(take=(), drop=drop, waiting_on=waiting_on)
    if len(finished) < batch_groups:
        return BatchPlan(take=(), drop=drop)
    take = finished[:batch_groups]
    stale_kept = sum(1 for g in take if trained_version - g.version > max_staleness)
    return BatchPlan(take=tuple(g.uid for g in take), drop=drop, stale_kept=stale_kept)


def _groups_to_wait_for(groups: list[GroupState], trained_version: int, batch_groups: int, max_staleness: int) -> int:
    """Running groups the ``wait`` policy must see finish before this update may start (0: go ahead).

    A group of version ``u`` is due at the update of version ``u + K`` at the latest. Taking finished
    groups oldest first is earliest-deadline-first; it keeps every deadline iff, for each horizon
    ``d = 0 .. K``, the groups due within ``d`` more updates that cannot fit into those ``d`` later
    batches are in this one. Completion order is arbitrary (a group admitted later may finish first), so
    checking only the groups due now (``d = 0``) is not enough. Admission pacing keeps the number due
    within ``d`` updates at most ``(d + 1) * B``, so waiting always ends once these groups finish.
    """
    waiting = 0
    for horizon in range(max_staleness + 1):
        cutoff = trained_version + horizon - max_staleness
        due = [g for g in groups if g.version <= cutoff]
        must_take = len(due) - horizon * batch_groups
        due_finished = sum(1 for g in due if g.finished)
        if must_take > min(batch_groups, due_finished):
            # Zero when all due groups have finished but do not fit (pacing was bypassed): waiting cannot help.
            waiting = max(waiting, len(due) - due_finished)
    return waiting


def staleness_metrics(
    turn_versions: Sequence[Sequence[int]], trained_version: int, max_staleness: int, prefix: str = "async/staleness"
) -> dict[str, float]:
    """Lag histogram over turns and version spans over trajectories, for one trained batch.

    Args:
        turn_versions: for each trajectory, the version of each of its generated turns.
        trained_version: the version the update started from.
        max_staleness: ``K``; the histogram has bins ``0 .. K`` and ``over`` (lag > K).
        prefix: metric name prefix.

    Returns:
        ``{prefix}/turn_lag/{k}`` (fraction of turns with lag ``k``), ``{prefix}/turn_lag/over``,
        ``{prefix}/turn_lag/mean`` and ``/max``, ``{prefix}/versions_per_trajectory/mean`` and ``/max``
        (distinct versions that generated one trajectory), ``{prefix}/multi_version_trajectories``
        (fraction of trajectories with turns from more than one version); empty without turns.
    """
    lags = [trained_version - v for versions in turn_versions for v in versions]
    if not lags:
        return {}
    if min(lags) < 0:
        raise ValueError(f"a turn was generated by a version newer than the trained one ({trained_version})")
    total = len(lags)
    metrics = {f"{prefix}/turn_lag/{k}": sum(1 for lag in lags if lag == k) / total for k in range(max_staleness + 1)}
    metrics[f"{prefix}/turn_lag/over"] = sum(1 for lag in lags if lag > max_staleness) / total
    metrics[f"{prefix}/turn_lag/mean"] = sum(lags) / total
    metrics[f"{prefix}/turn_lag/max"] = float(max(lags))
    spans = [len(set(versions)) for versions in turn_versions if versions]
    metrics[f"{prefix}/versions_per_trajectory/mean"] = sum(spans) / len(spans)
    metrics[f"{prefix}/versions_per_trajectory/max"] = float(max(spans))
    metrics[f"{prefix}/multi_version_trajectories"] = sum(1 for s in spans if s > 1) / len(spans)
    return metrics


class LevelMeter:
    """Time-weighted mean and maximum of a level (groups in flight, buffer depth) over a window.

    The level is piecewise constant: :meth:`set` records a change at time ``now``; :meth:`window` closes
    the window at ``now``, returns its statistics and opens the next one at the current level.
    """

    def __init__(self, now: float, level: float = 0.0):
        self._start = now
        self._last = now
        self._level = level
        self._area = 0.0
        self._max = level

    @property
    def level(self) -> float:
        return self._level

    def set(self, level: float, now: float) -> None:
        if now < self._last:
            raise ValueError(f"time went back from {self._last} to {now}")
        self._area += self._level * (now - self._last)
        self._last = now
        self._level = level
        self._max = max(self._max, level)

    def window(self, now: float) -> tuple[float, float]:
        """Close the window at ``now``; return ``(time-weighted mean, max)`` over it."""
        self.set(self._level, now)
        span = now - self._start
        mean = self._area / span if span > 0 else self._level
        result = (mean, self._max)
        self._start, self._area, self._max = now, 0.0, self._level
        return result


def idle_fraction(mean_busy: float, capacity: float) -> float:
    """``1 - mean_busy / capacity`` clipped to ``[0, 1]`` (capacity in the same unit as ``mean_busy``)."""
    if capacity <= 0 or math.isnan(mean_busy):
        return 1.0
    return min(1.0, max(0.0, 1.0 - mean_busy / capacity))
