"""The verl wiring of the asynchronous pipeline without Ray: TransferQueue listings to group states, the admission
pump's pacing, and the config check before verl starts."""

from __future__ import annotations

import itertools

import pytest
import verl  # noqa: F401  (loads the plugin first: importing async_trainer before verl would be circular)
from omegaconf import OmegaConf

from agentrl_verl.core import async_trainer
from agentrl_verl.core.async_trainer import (
    AdmissionPump,
    AgentRLAsyncTrainer,
    Pipeline,
    grouped,
    snapshot_groups,
)
from agentrl_verl.core.config import AsyncConfig


def _listing(prompts: dict[str, str], trajectories: dict[str, int]) -> dict[str, dict]:
    items = {uid: {"is_prompt": True, "status": status, "global_steps": 3} for uid, status in prompts.items()}
    items.update({key: {"status": "success", "min_global_steps": v} for key, v in trajectories.items()})
    return items


def test_snapshot_uses_oldest_turn_of_finished_groups_and_admission_version_of_running_ones():
    items = _listing({"a": "finished", "b": "running", "c": "pending", "d": "failure"},
                     {"a_0_0": 4, "a_1_0": 2, "b_0_0": 5})
    state = snapshot_groups(items, admitted_version={"a": 1, "b": 3, "c": 4})
    groups = {g.uid: g for g in state["groups"]}
    assert (groups["a"].version, groups["a"].finished) == (2, True)  # oldest turn over the group
    assert (groups["b"].version, groups["b"].finished) == (3, False)  # running: version at admission
    assert groups["c"].version == 4 and not groups["c"].finished
    assert state["failed"] == ["d"] and (state["running"], state["finished"]) == (2, 1)
    # A trajectory tag older than the admission (its turns all came from a cross-policy member) does not age the group.
    assert snapshot_groups(_listing({"e": "finished"}, {"e_0_0": 1, "e_1_0": 6}), {"e": 5})["groups"][0].version == 5
    # A group the pump did not admit (resumed run) falls back to its submission step - 1.
    assert snapshot_groups(_listing({"x": "running"}, {}), {})["groups"][0].version == 2


def test_a_batch_holds_each_group_together_in_order_of_arrival():
    # Episodes end interleaved across groups; verl cuts the batch into micro-batches in this order.
    items = _listing({"b": "finished", "a": "finished"},
                     {"b_0_0": 1, "a_1_0": 1, "b_1_0": 1, "a_0_0": 1, "b_2_0": 1})
    assert list(grouped(items)) == ["b", "b_0_0", "b_1_0", "b_2_0", "a", "a_1_0", "a_0_0"]
    assert grouped(items) == items  # the same keys and tags


def test_pump_admits_up_to_the_pacer_quota_and_tags_the_version(monkeypatch):
    listing: dict[str, dict] = {}
    monkeypatch.setattr(async_trainer.tq, "kv_list", lambda partition: {partition: dict(listing)})
    pipeline = Pipeline(AsyncConfig(max_staleness=1), batch_groups=2, group_size=4)
    started: list[str] = []

    def submit(count: int) -> list[str]:
        uids = [f"u{len(started) + i}" for i in range(count)]
        started.extend(uids)
        listing.update({uid: {"is_prompt": True, "status": "running", "global_steps": 1} for uid in uids})
        return uids

    pump = AdmissionPump(pipeline, submit)
    assert pump.tick() == 4  # (K + 1) * B groups before the first update
    assert pump.tick() == 0
    pipeline.pacer.on_consumed(2)
    for uid in started[:2]:
        del listing[uid]
    assert pump.tick() == 0  # consumed, but no new version yet: a new group could exceed the bound
    pipeline.pacer.on_version(1)
    assert pump.tick() == 2
    assert pipeline.admitted_version == {"u0": 0, "u1": 0, "u2": 0, "u3": 0, "u4": 1, "u5": 1}
    assert pipeline.counts["admitted"] == 6


def test_failed_groups_are_replaced_until_more_than_the_limit_fail_with_no_batch_between():
    from agentrl_verl.core.async_trainer import Pipeline
    from agentrl_verl.core.config import AsyncConfig

    pipeline = Pipeline(AsyncConfig(), batch_groups=2, group_size=4)
    assert pipeline.failure_limit == 8  # four batches' worth by default
    for _ in range(3):  # groups that fail now and then: a batch in between each time
        pipeline.count_failures(5)
        pipeline.on_batch()
    assert pipeline.counts["failed"] == 15
    pipeline.count_failures(8)  # at the limit: still replaced
    with pytest.raises(RuntimeError, match=r"9 groups failed .*agentrl\.async\.max_failed_groups=8"):
        pipeline.count_failures(1)  # every episode raises: the run stops instead of admitting forever
    assert Pipeline(AsyncConfig(max_failed_groups=1), batch_groups=2, group_size=4).failure_limit == 1


def test_the_sampler_stops_a_run_whose_every_episode_raises(monkeypatch):
    """The replay buffer's sampler over a listing where the pump's every new group has failed by the next look."""
    from collections import defaultdict

    from agentrl_verl.core.async_trainer import PARTITION, Pipeline, StalenessReplayBuffer
    from agentrl_verl.core.config import AsyncConfig

    buffer = StalenessReplayBuffer.__new__(StalenessReplayBuffer)  # no TransferQueue: its listing is faked below
    buffer.pipeline = Pipeline(AsyncConfig(max_failed_groups=5, poll_interval=0.001), batch_groups=2, group_size=4)
    buffer.pump = None
    buffer.partitions = {PARTITION: {}}
    buffer.pending_keys, buffer.running_keys, buffer.finished_keys = (defaultdict(set) for _ in range(3))
    buffer.failure_keys, buffer.prompt_global_steps = defaultdict(set), defaultdict(dict)
    uids = (f"g{i}" for i in itertools.count())
    looks = []

    def sync():  # each look: the two groups admitted since the last one have failed
        looks.append(1)
        buffer.failure_keys[PARTITION] |= {next(uids), next(uids)}

    monkeypatch.setattr(buffer, "_sync_metadata_from_transfer_queue", sync)
    monkeypatch.setattr(buffer, "_clear_groups", lambda partition, removed: buffer.failure_keys[partition].clear())
    with pytest.raises(RuntimeError, match=r"6 groups failed .*max_failed_groups=5"):
        buffer.sample(global_steps=1, partition_id=PARTITION, batch_size=2)
    assert len(looks) == 3 and buffer.pipeline.counts["failed"] == 6


def test_turn_versions_leave_out_cross_policy_members():
    from agentrl_verl.core.cross_policy import TurnLog
    from agentrl_verl.core.episode import EpisodeRecord

    log = TurnLog(policies=["current", "stale", "current", "current"], versions=[5, 0, None, 6],
                  spans=[(0, 1), (1, 2), (2, 3), (3, 4)])
    record = EpisodeRecord("calc", "completed", 1.0, 1.0, 4, turn_log=log)
    assert async_trainer.trained_turn_versions(record) == [5, 6]
    assert async_trainer.trained_turn_versions(None) == []  # a row without a record


def test_a_bad_config_fails_before_verl_constructs_the_trainer(monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("verl's trainer was constructed")

    monkeypatch.setattr(async_trainer.PPOTrainer, "__init__", started)
    config = OmegaConf.create({"agentrl": {"async": {"stale_policy": "keep"}}, "algorithm": {},
                               "data": {"train_batch_size": 4}, "actor_rollout_ref": {"rollout": {"n": 2}}})
    with pytest.raises(ValueError, match="rollout_correction.rollout_is=token"):
        AgentRLAsyncTrainer(config)
    config.algorithm.rollout_correction = {"rollout_is": "token"}
    config.agentrl.asyn = {"max_staleness": 2}
    with pytest.raises(ValueError, match="unknown key agentrl.asyn: did you mean agentrl.async"):
        AgentRLAsyncTrainer(config)
    del config.agentrl["asyn"]
    with pytest.raises(AssertionError, match="constructed"):  # a valid config goes on to verl's constructor
        AgentRLAsyncTrainer(config)
    assert config.agentrl.agent.max_turns == 20  # the driver wrote the complete tree back for the workers


@pytest.mark.parametrize(("max_staleness", "correction", "uncorrected"), [
    (3, None, True),
    (1, {"bypass_mode": False, "rollout_is": None}, True),
    (3, {"bypass_mode": True}, False),
    (3, {"rollout_is": "token"}, False),
    (0, None, False),  # synchronous: nothing is stale
])
def test_stale_turns_uncorrected(max_staleness, correction, uncorrected):
    assert async_trainer.stale_turns_uncorrected(max_staleness, correction) is uncorrected
