"""Unit tests of the pure staleness module: config, admission pacing, batch planning, metrics, meters."""

from __future__ import annotations

import pytest

from agentrl_verl.core.config import StalePolicy
from agentrl_verl.core.staleness import (
    AdmissionPacer,
    GroupState,
    LevelMeter,
    idle_fraction,
    plan_batch,
    staleness_metrics,
)

# ---- admission pacing ---------------------------------------------------------------------------------


def test_pacer_with_zero_staleness_is_synchronous():
    pacer = AdmissionPacer(batch_groups=4, max_staleness=0, capacity=100)
    assert pacer.quota(running=0, finished=0) == 4
    assert pacer.quota(running=4, finished=0) == 0
    pacer.on_consumed(4)  # the trainer took the batch and is updating: nothing may start on old weights
    assert pacer.quota(running=0, finished=0) == 0
    pacer.on_version(1)
    assert pacer.quota(running=0, finished=0) == 4


def test_pacer_admits_k_plus_one_batches_ahead_and_respects_capacity_and_inflight():
    pacer = AdmissionPacer(batch_groups=4, max_staleness=2, capacity=100)
    assert pacer.quota(running=0, finished=0) == 12
    pacer.on_consumed(4)
    assert pacer.quota(running=5, finished=3) == 0  # 4 consumed + 8 outstanding = (0 + 2 + 1) * 4
    pacer.on_version(1)
    assert pacer.quota(running=5, finished=3) == 4
    assert AdmissionPacer(4, 2, capacity=10).quota(running=5, finished=3) == 2
    assert AdmissionPacer(4, 2, capacity=100, max_inflight=6).quota(running=5, finished=3) == 1
    with pytest.raises(ValueError, match="went back"):
        pacer.on_version(0)


def test_pacer_admits_nothing_beyond_the_groups_the_run_trains():
    pacer = AdmissionPacer(batch_groups=4, max_staleness=1, capacity=100, total_groups=8)
    assert pacer.quota(running=0, finished=0) == 8
    unbounded = AdmissionPacer(batch_groups=4, max_staleness=1, capacity=100)
    for p in (pacer, unbounded):
        p.on_consumed(4)
        p.on_version(1)
    # The second (last) batch is out: the unbounded pacer would start a third the run never trains.
    assert (pacer.quota(running=2, finished=2), unbounded.quota(running=2, finished=2)) == (0, 4)
    assert pacer.quota(running=1, finished=0) == 3  # 3 of the last batch were dropped: their slots refill


# ---- batch planning -----------------------------------------------------------------------------------


def _groups(*specs):
    return [GroupState(uid=uid, version=version, finished=finished) for uid, version, finished in specs]


def test_plan_takes_oldest_finished_groups_first():
    groups = _groups(("a", 3, True), ("b", 2, True), ("c", 3, False), ("d", 3, True))
    plan = plan_batch(groups, trained_version=3, batch_groups=2, max_staleness=1, policy=StalePolicy.KEEP)
    assert plan.take == ("b", "a") and plan.ready and plan.stale_kept == 0


def test_plan_not_ready_without_enough_finished_groups():
    plan = plan_batch(_groups(("a", 0, True), ("b", 0, False)), 0, 2, 1, StalePolicy.KEEP)
    assert not plan.ready and plan.take == ()


def test_wait_holds_the_step_for_running_groups_at_the_bound():
    groups = _groups(("old", 2, False), ("a", 3, True), ("b", 3, True))
    plan = plan_batch(groups, trained_version=3, batch_groups=2, max_staleness=1, policy=StalePolicy.WAIT)
    assert not plan.ready and plan.waiting_on == 1
    finished = _groups(("old", 2, True), ("a", 3, True), ("b", 3, True))
    plan = plan_batch(finished, trained_version=3, batch_groups=2, max_staleness=1, policy=StalePolicy.WAIT)
    assert plan.take == ("old", "a") and plan.stale_kept == 0


def test_drop_discards_finished_groups_beyond_the_bound_even_when_not_ready():
    groups = _groups(("old", 1, True), ("a", 3, True), ("run", 1, False))
    plan = plan_batch(groups, trained_version=3, batch_groups=2, max_staleness=1, policy=StalePolicy.DROP)
    assert plan.drop == ("old",) and not plan.ready
    plan = plan_batch(groups + _groups(("b", 2, True)), 3, 2, 1, StalePolicy.DROP)
    assert plan.drop == ("old",) and plan.take == ("b", "a")


def test_keep_trains_groups_beyond_the_bound_and_counts_them():
    groups = _groups(("old", 0, True), ("a", 3, True), ("run", 0, False))
    plan = plan_batch(groups, trained_version=3, batch_groups=2, max_staleness=1, policy=StalePolicy.KEEP)
    assert plan.take == ("old", "a") and plan.stale_kept == 1 and plan.drop == ()


# ---- metrics and meters -------------------------------------------------------------------------------


def test_staleness_metrics_histogram_and_spans():
    metrics = staleness_metrics([[3, 4], [4], [2, 3, 4]], trained_version=4, max_staleness=1)
    # lags: [1, 0], [0], [2, 1, 0] -> 3 x 0, 2 x 1, 1 x 2 (over the bound)
    assert metrics["async/staleness/turn_lag/0"] == pytest.approx(3 / 6)
    assert metrics["async/staleness/turn_lag/1"] == pytest.approx(2 / 6)
    assert metrics["async/staleness/turn_lag/over"] == pytest.approx(1 / 6)
    assert metrics["async/staleness/turn_lag/max"] == 2
    assert metrics["async/staleness/versions_per_trajectory/max"] == 3
    assert metrics["async/staleness/multi_version_trajectories"] == pytest.approx(2 / 3)
    assert staleness_metrics([[]], 0, 1) == {}
    with pytest.raises(ValueError, match="newer"):
        staleness_metrics([[5]], trained_version=4, max_staleness=1)


def test_level_meter_is_time_weighted():
    meter = LevelMeter(now=0.0)
    meter.set(4, now=1.0)  # 0 during [0, 1)
    meter.set(2, now=3.0)  # 4 during [1, 3)
    mean, peak = meter.window(now=4.0)  # 2 during [3, 4)
    assert mean == pytest.approx((0 + 8 + 2) / 4) and peak == 4
    mean, peak = meter.window(now=6.0)  # the next window starts at the current level
    assert mean == pytest.approx(2) and peak == 2
    assert idle_fraction(mean_busy=1.0, capacity=4) == pytest.approx(0.75)
    assert idle_fraction(mean_busy=9.0, capacity=4) == 0.0
