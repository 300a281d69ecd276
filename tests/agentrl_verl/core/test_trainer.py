"""The verl wiring of the training step: estimator registration, tasks reaching it, the trainer mode and
per-task metrics."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest
import torch
import verl  # noqa: F401 - loads our plugin, which registers everything below
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls

from agentrl_verl.core.advantage import task_norm_grpo_advantage
from agentrl_verl.core.trainer import (
    ESTIMATOR_NAME,
    TRAINER_MODE,
    AgentRLSyncTrainer,
    SkipEmptyBatchMixin,
    batch_tasks,
    compute_task_norm_grpo_advantage,
    episode_metrics,
    wait_for_start_model,
)


def _data():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    rewards = torch.zeros(6, 3)
    for i, r in enumerate([1.0, 0.0, 0.0, 1.0, 1.0, -0.2]):
        rewards[i, int(mask[i].sum()) - 1] = r
    uid = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uid})
    return data, ["os", "os", "os", "db", "db", "db"]


def test_registered_with_verl():
    assert get_adv_estimator_fn(ESTIMATOR_NAME) is compute_task_norm_grpo_advantage
    assert get_trainer_cls(TRAINER_MODE) is AgentRLSyncTrainer


def test_estimator_through_verl_compute_advantage():
    data, tasks = _data()
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": True})
    with pytest.raises(RuntimeError, match="trainer.v1.trainer_mode=agentrl_sync"):
        compute_advantage(data, adv_estimator=ESTIMATOR_NAME, config=config)
    with batch_tasks(tasks, "token"):
        out = compute_advantage(data, adv_estimator=ESTIMATOR_NAME, config=config)
    expected = task_norm_grpo_advantage(data.batch["token_level_rewards"], data.batch["response_mask"],
                                        data.non_tensor_batch["uid"], tasks, "token")
    torch.testing.assert_close(out.batch["advantages"], expected)
    for task in ("os", "db"):
        rows = torch.tensor([t == task for t in tasks])
        values = out.batch["advantages"][rows][data.batch["response_mask"][rows] > 0].double()
        assert abs(values.mean()) < 1e-6 and abs(values.std() - 1) < 1e-4
    # Off, with one group structure: exactly verl's GRPO (and Dr.GRPO when std scaling is off).
    for norm in (True, False):
        with batch_tasks(tasks, "off"):
            ours, _ = compute_task_norm_grpo_advantage(
                data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"],
                OmegaConf.create({"norm_adv_by_std_in_grpo": norm}))
        grpo, _ = compute_grpo_outcome_advantage(data.batch["token_level_rewards"], data.batch["response_mask"],
                                                 data.non_tensor_batch["uid"], norm_adv_by_std_in_grpo=norm)
        torch.testing.assert_close(ours, grpo)


def test_trainer_mode_reports_sync_to_verl():
    trainer = AgentRLSyncTrainer.__new__(AgentRLSyncTrainer)
    trainer.trainer_mode = TRAINER_MODE  # what PPOTrainer.__init__ assigns from the config
    assert trainer.trainer_mode == "sync" and trainer.registered_mode == TRAINER_MODE


def test_replay_buffer_looks_for_the_batch_every_poll_interval(monkeypatch):
    """verl's sync buffer sleeps 2 s between looks, which rounded each step's generation up to a multiple of 2 s."""
    from verl.trainer.ppo.v1 import replay_buffer

    from agentrl_verl.core.config import AgentRLConfig, AsyncConfig

    trainer = AgentRLSyncTrainer.__new__(AgentRLSyncTrainer)
    trainer.trainer_mode = TRAINER_MODE
    trainer.agentrl = AgentRLConfig(async_=AsyncConfig(poll_interval=0.25))
    trainer.config = OmegaConf.create({
        "trainer": {"v1": {"sampler": {"max_off_policy_threshold": None, "max_off_policy_strategy": "drop",
                                       "sampler_kwargs": {}}}},
        "algorithm": {}, "data": {"train_batch_size": 4}})
    buffer = trainer._build_replay_buffer()
    assert type(buffer) is replay_buffer.ReplayBuffer  # verl's sync buffer, only looking more often
    sleeps = []
    monkeypatch.setattr(replay_buffer.time, "sleep", sleeps.append)
    buffer._wait_for_next_poll("train", replay_buffer.time.time())
    assert sleeps == [0.25]


def test_fit_waits_for_the_agent_loop_workers_and_logs_the_wait_with_step_1(monkeypatch):
    from verl.trainer.ppo.v1 import trainer_base

    from agentrl_verl.core import trainer as trainer_module

    events = []

    class Worker:
        def __init__(self, name):
            self.__ray_ready__ = type("Method", (), {"remote": staticmethod(lambda: f"ready-{name}")})

    clock = iter([100.0, 102.5])  # the wait: from before the workers are asked to after they answered
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(trainer_module.ray, "get", lambda refs: events.append(("get", list(refs))))
    monkeypatch.setattr(PPOTrainerSync, "fit", lambda self, manager: events.append(("verl fit", manager)))
    monkeypatch.setattr(trainer_base.PPOTrainer, "_compute_metrics", lambda self, *args: None)
    monkeypatch.setattr(trainer_module, "batch_fields", lambda batch, name: {name: []})
    manager = type("Manager", (), {"agent_loop_workers": [Worker(0), Worker(1)]})()
    trainer = AgentRLSyncTrainer.__new__(AgentRLSyncTrainer)
    trainer.fit(manager)
    assert events == [("get", ["ready-0", "ready-1"]), ("verl fit", manager)]
    step_1, step_2 = {}, {}
    trainer._compute_metrics(None, step_1, {}, 1, 0)
    trainer._compute_metrics(None, step_2, {}, 2, 0)
    assert step_1["agentrl/agent_loop_ready_s"] == 2.5 and "agentrl/agent_loop_ready_s" not in step_2

def test_a_batch_without_a_loss_token_skips_its_update_and_only_its_rows_leave_verls_metrics(monkeypatch):
    from transfer_queue import KVBatchMeta

    from agentrl_verl.core import trainer as trainer_module

    masks = {"a": [0, 0], "b": [0], "c": [1, 0], "d": [0, 0]}  # per row key: its response mask
    monkeypatch.setattr(trainer_module, "batch_fields", lambda batch, name: {name: [masks[k] for k in batch.keys]})

    class Verl:  # verl's step as far as the mixin sees it: sample, balance, update; then the step's metrics
        def __init__(self, batches):
            self.batches, self.updated, self.measured, self.global_steps = iter(batches), [], [], 1

        def _step_once(self, metrics, timing_raw, sample_batch_size):
            keys = next(self.batches)
            batch = self._balance_batch(KVBatchMeta(partition_id="train", keys=keys, tags=[{}] * len(keys)), metrics)
            self.updated.append(batch.keys)
            return batch

        def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
            return KVBatchMeta(partition_id="train", keys=batch.keys, tags=[{"n": k} for k in batch.keys])

        def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
            self.measured.append((batch.keys, [tag["n"] for tag in batch.tags]))

    class Trainer(SkipEmptyBatchMixin, Verl):
        pass

    trainer = Trainer([["a", "b"], ["c", "d"], ["d"], ["c"]])
    # One step of two local updates (parameter_sync_step 2): the first batch is all masked, the second is not.
    step = {}
    first, second = trainer._step_once(step, {}, 2), trainer._step_once(step, {}, 2)
    assert first.keys == ["a", "b"] and trainer.updated == [["c", "d"]]
    trainer._compute_metrics(KVBatchMeta(partition_id="train", keys=first.keys + second.keys,
                                         tags=[{"n": "a"}, {"n": "b"}, *second.tags]), step, {}, 1, 0)
    assert step["agentrl/skipped_batches"] == 1 and trainer.measured == [(["c", "d"], ["c", "d"])]
    # A step whose only batch is all masked: none of verl's metrics, the step's own counters and times.
    step = {}
    trainer._compute_metrics(trainer._step_once(step, {}, 1), step, {"step": 2.0}, 2, 0)
    assert step == {"agentrl/skipped_batches": 1.0, "training/global_step": 2, "training/epoch": 0,
                    "timing_s/step": 2.0}
    assert len(trainer.measured) == 1
    # A batch with a loss token: trained and measured whole.
    step = {}
    trainer._compute_metrics(trainer._step_once(step, {}, 1), step, {}, 3, 0)
    assert step == {"agentrl/skipped_batches": 0.0} and trainer.measured[-1] == (["c"], ["c"])


def test_both_trainer_modes_skip_empty_batches_right_above_verls_trainer():
    # The mixin must be the last class before verl's in either mode's MRO: the other mixins' _compute_metrics then
    # see only what a skipped batch leaves (its end-to-end run: tests/agentrl_verl/e2e/test_empty_batch_e2e.py).
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from agentrl_verl.core.async_trainer import AgentRLAsyncTrainer

    for trainer, verls in ((AgentRLSyncTrainer, PPOTrainerSync), (AgentRLAsyncTrainer, PPOTrainer)):
        mro = trainer.__mro__
        assert mro[mro.index(SkipEmptyBatchMixin) + 1] is verls, trainer


def test_start_model_wait_ends_when_the_directory_appears_and_times_out_naming_the_key(tmp_path):
    model = tmp_path / "warmup_model"
    assert wait_for_start_model(str(model), 0.0) < 1  # no wait configured: verl reports a missing model itself
    written = threading.Timer(0.3, lambda: (model.mkdir(), (model / "config.json").write_text("{}")))
    written.start()
    assert 0.25 <= wait_for_start_model(str(model), 30.0, poll_s=0.05) < 5
    with pytest.raises(TimeoutError, match=r"agentrl.start_model_wait_s=0.2 s"):
        wait_for_start_model(str(tmp_path / "never"), 0.2, poll_s=0.05)


def test_the_start_model_wait_reports_on_stdout_while_it_lasts(tmp_path, capsys):
    # On stdout, which Ray forwards to the driver: the demo's stall watchdog counts those lines as signs of life.
    with pytest.raises(TimeoutError):
        wait_for_start_model(str(tmp_path / "never"), 0.3, poll_s=0.05, report_every_s=0.1)
    reports = [line for line in capsys.readouterr().out.splitlines() if line.startswith("waiting for the start model")]
    assert len(reports) >= 2 and str(tmp_path / "never") in reports[0]


def test_setup_waits_for_the_start_model_before_verl_reads_it(monkeypatch):
    from verl.trainer.ppo.v1 import trainer_base

    from agentrl_verl.core import trainer as trainer_module
    from agentrl_verl.core.config import AgentRLConfig

    events = []
    monkeypatch.setattr(trainer_module, "wait_for_start_model",
                        lambda path, timeout_s: events.append(("wait", path, timeout_s)) or 0.0)
    monkeypatch.setattr(trainer_base.PPOTrainer, "_setup", lambda self: events.append(("verl setup",)))
    trainer = AgentRLSyncTrainer.__new__(AgentRLSyncTrainer)
    trainer.agentrl = AgentRLConfig(start_model_wait_s=60.0, cross_policy={"enable": False})
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"model": {"path": "/models/warm"}},
                                       "agentrl": {"cross_policy": {"enable": False}}})
    trainer._setup()
    assert events == [("wait", "/models/warm", 60.0), ("verl setup",)]


def test_episode_metrics():
    from agentrl_verl.core.episode import EpisodeRecord

    def extra(**fields):
        return EpisodeRecord(**fields).to_extra_fields()

    extras = [
        extra(task="os", status="completed", env_reward=1.0, reward=1.0, turns=2, generated_tokens=10, env_tokens=5,
              env_latency_s=0.5),
        extra(task="os", status="agent context limit", env_reward=0.0, reward=-0.2, turns=4, generated_tokens=30,
              env_tokens=15, env_latency_s=1.5),
        extra(task="db", status="task error", env_reward=0.0, reward=-0.2, turns=0, generated_tokens=0, env_tokens=0,
              env_latency_s=0.1),
        None,  # a row from another agent loop
    ]
    m = episode_metrics(extras)
    assert m["agentrl/os/success_rate"] == 0.5 and m["agentrl/db/success_rate"] == 0.0
    assert m["agentrl/os/reward"] == pytest.approx(0.4) and m["agentrl/os/turns"] == 3.0
    assert m["agentrl/os/status/completed"] == 1 and m["agentrl/os/status/agent_context_limit"] == 1
    assert m["agentrl/db/status/task_error"] == 1 and m["agentrl/all/episodes"] == 3
    assert m["agentrl/all/generated_tokens"] == pytest.approx(40 / 3)
    # The tail of each task's episodes (numpy's linear percentile): os's two latencies 0.5 and 1.5.
    assert m["agentrl/os/env_latency_s_p90"] == pytest.approx(1.4) and m["agentrl/os/turns_p90"] == pytest.approx(3.8)
    assert m["agentrl/os/generate_s"] == 0.0 and m["agentrl/all/env_latency_s_p90"] == pytest.approx(1.3)
