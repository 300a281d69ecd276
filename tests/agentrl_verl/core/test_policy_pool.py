"""The pool-aware server client (per-turn routing over member clients, behaviour log-prob bookkeeping) and the stale
pool's launch beside verl's setup."""

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import Role
from verl.workers.rollout.replica import TokenOutput

from agentrl_verl.core import policy_pool
from agentrl_verl.core.cross_policy import CURRENT, FIXED, STALE, PolicyRouter, TurnLog
from agentrl_verl.core.episode import EpisodeRecord
from agentrl_verl.core.policy_pool import BesideSetup, CrossPolicyTrainerMixin, PolicyPoolClient, stale_pool_config


class FakeServer:
    """A member client: fixed log-prob per token and weight version, records its calls."""

    def __init__(self, logprob: float, version: int) -> None:
        self.logprob, self.version, self.calls = logprob, version, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, len(prompt_ids)))
        n = 2 + len(self.calls) % 3
        return TokenOutput(
            token_ids=list(range(100, 100 + n)),
            log_probs=[self.logprob] * n,
            extra_fields={"global_steps": self.version},
        )


async def _episode(client, request_id: str, turns: int) -> tuple[TurnLog, list[int], list[float]]:
    """A minimal agent loop: generated tokens (mask 1) and a 2-token observation (mask 0) per turn."""
    log, ids, mask, logprobs = TurnLog(), [1, 2, 3], [], []
    for _ in range(turns):
        out = await client.generate(request_id, prompt_ids=ids, sampling_params={})
        log.record(out.extra_fields, start=len(mask), num_tokens=len(out.token_ids))
        ids, mask, logprobs = ids + out.token_ids, mask + [1] * len(out.token_ids), logprobs + out.log_probs
        ids, mask, logprobs = ids + [7, 8], mask + [0, 0], logprobs + [0.0, 0.0]
    return log, mask, logprobs


def _client(ratio: float, sticky: bool = False, seed: int = 0):
    current, stale = FakeServer(-0.1, version=6), FakeServer(-2.0, version=4)
    router = PolicyRouter({CURRENT: 1 - ratio, STALE: ratio}, seed=seed, sticky=sticky)
    return PolicyPoolClient(OmegaConf.create({}), {CURRENT: current, STALE: stale}, router), current, stale


async def test_turns_mix_members_and_keep_the_producers_logprobs():
    client, current, stale = _client(0.5)
    episodes = await asyncio.gather(*[_episode(client, f"traj-{i}", turns=6) for i in range(40)])
    assert current.calls and stale.calls
    assert sum(len(set(log.policies)) == 2 for log, _, _ in episodes) > 30  # single trajectories mix both
    version = {CURRENT: 6, STALE: 4}
    logprob = {CURRENT: -0.1, STALE: -2.0}
    for log, mask, logprobs in episodes:
        assert log.versions == [version[p] for p in log.policies]
        for owner, m, lp in zip(log.token_policies(len(mask)), mask, logprobs, strict=True):
            assert (owner is not None) == bool(m)
            assert lp == (logprob[owner] if owner else 0.0)
    # The draws are the router's: same (trajectory, turn) -> same member as a fresh router says.
    router = PolicyRouter({CURRENT: 0.5, STALE: 0.5}, seed=0)
    log0 = episodes[0][0]
    assert log0.policies == [router.choose("traj-0", k) for k in range(6)]


async def test_ratio_zero_never_touches_the_stale_pool_and_sticky_keeps_one_member():
    client, current, stale = _client(0.0)
    await asyncio.gather(*[_episode(client, f"t{i}", turns=4) for i in range(10)])
    assert stale.calls == [] and len(current.calls) == 40
    client, _, _ = _client(0.5, sticky=True)
    logs = await asyncio.gather(*[_episode(client, f"t{i}", turns=5) for i in range(30)])
    assert all(len(set(log.policies)) == 1 for log, _, _ in logs)
    assert {log.policies[0] for log, _, _ in logs} == {CURRENT, STALE}


def test_pool_client_needs_a_client_per_member():
    with pytest.raises(ValueError, match=r"\['stale'\] have a probability but no server client"):
        PolicyPoolClient(OmegaConf.create({}), {CURRENT: FakeServer(0, 0)}, PolicyRouter({CURRENT: 1, STALE: 1}))


def test_stale_resource_spec():
    cfg = OmegaConf.create(
        {
            "agentrl": {"cross_policy": {"enable": True, "stale_ratio": 0.5, "stale_refresh_steps": 2}},
            "actor_rollout_ref": {
                "rollout": {
                    "tensor_model_parallel_size": 2,
                    "data_parallel_size": 1,
                    "pipeline_model_parallel_size": 1,
                    "nnodes": 0,
                    "n_gpus_per_node": 8,
                }
            },
        }
    )
    OmegaConf.set_struct(cfg, True)
    stale = stale_pool_config(cfg, num_replicas=3)
    assert (stale.actor_rollout_ref.rollout.nnodes, stale.actor_rollout_ref.rollout.n_gpus_per_node) == (1, 6)
    assert cfg.actor_rollout_ref.rollout.n_gpus_per_node == 8  # the trainer's own config is untouched


async def test_fixed_member_turns_carry_no_weight_version():
    current, fixed = FakeServer(-0.1, version=6), FakeServer(-7.6, version=0)
    router = PolicyRouter({CURRENT: 0.5, FIXED: 0.5})
    client = PolicyPoolClient(OmegaConf.create({}), {CURRENT: current, FIXED: fixed}, router, fixed_members=[FIXED])
    logs = await asyncio.gather(*[_episode(client, f"t{i}", turns=4) for i in range(10)])
    assert current.calls and fixed.calls
    for log, _, _ in logs:
        assert log.versions == [None if p == FIXED else 6 for p in log.policies]


def test_fixed_model_spec_loads_its_own_weights():
    cfg = OmegaConf.create({
        "actor_rollout_ref": {
            "model": {"path": "/actor", "hf_config_path": "/actor", "tokenizer_path": "/actor/tok"},
            "rollout": {"tensor_model_parallel_size": 1, "data_parallel_size": 1, "pipeline_model_parallel_size": 1,
                        "nnodes": 0, "n_gpus_per_node": 2, "load_format": "dummy"},
        }
    })
    OmegaConf.set_struct(cfg, True)
    fixed = stale_pool_config(cfg, num_replicas=1, model_path="/other")
    # Everything the replica reads comes from the fixed model, and real weights are loaded (not verl's dummy init).
    assert dict(fixed.actor_rollout_ref.model) == {"path": "/other", "hf_config_path": None, "tokenizer_path": None}
    assert fixed.actor_rollout_ref.rollout.load_format == "auto"
    assert cfg.actor_rollout_ref.model.path == "/actor" and cfg.actor_rollout_ref.rollout.load_format == "dummy"
    assert stale_pool_config(cfg, num_replicas=1).actor_rollout_ref.model == cfg.actor_rollout_ref.model


# ---- the real agentrl_agent loop over a pool of two scripted servers ---------------------------------------


class ScriptedPolicy:
    """A member server: always the same tool call, with its own log-prob per token and weight version."""

    def __init__(self, tokenizer, logprob: float, version: int) -> None:
        self.tokenizer, self.logprob, self.version, self.turns = tokenizer, logprob, version, 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.turns += 1
        call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+1"}}\n</tool_call><|im_end|>'
        ids = self.tokenizer.encode(call, add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[self.logprob] * len(ids), stop_reason="completed",
                           extra_fields={"global_steps": self.version})


class LoopingEnv:
    """Answers every call with a tool result; finishes the episode after ``turns`` calls."""

    def __init__(self, turns: int) -> None:
        self.turns, self.calls = turns, 0

    async def start_sample(self, name, index=-1, custom_task=None):
        from env_adapters.client import StartedSession
        from env_adapters.task import function_tool

        tools = [function_tool("calculate", "evaluate", {"expression": {"type": "string"}})]
        return StartedSession(session_id=1, messages=[{"role": "user", "content": "add"}], tools=tools)

    async def interact(self, session_id, message):
        from env_adapters.protocol import InteractResponse, SampleStatus

        self.calls += 1
        if self.calls >= self.turns:
            return InteractResponse(finish=True, status=SampleStatus.COMPLETED, reward=1.0)
        tool = {"role": "tool", "tool_call_id": "call_1_0", "name": "calculate", "content": "2"}
        return InteractResponse(finish=False, status=SampleStatus.RUNNING, messages=[tool])

    async def cancel(self, session_id):
        return None


async def test_agent_loop_records_policy_version_and_behaviour_logprobs_per_turn():
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from agentrl_verl.core.agent_loop import AGENT_NAME, AgentRLAgentLoop
    from agentrl_verl.models.tiny import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    current, stale = ScriptedPolicy(tokenizer, -0.25, version=9), ScriptedPolicy(tokenizer, -3.0, version=8)
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 256, "response_length": 1024,
                                          "multi_turn": {"format": "hermes"}}},
        "data": {"apply_chat_template_kwargs": {}},
        "agentrl": {"env": {"url": "http://unused"}},
    })
    pool = PolicyPoolClient(config, {CURRENT: current, STALE: stale}, PolicyRouter({CURRENT: 0.5, STALE: 0.5}))
    outputs = []
    for episode in range(4):
        loop = AgentRLAgentLoop(
            trainer_config=DictConfigWrap(config), server_manager=pool, tokenizer=tokenizer, processor=None,
            dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data), hf_model_type="qwen2",
            env_client=LoopingEnv(turns=6))
        row = {"data_source": "calc", "extra_info": {"index": episode}, "index": episode, "global_steps": 10,
               "raw_prompt": [{"role": "user", "content": "x"}], "agent_name": AGENT_NAME}
        outputs.append(await loop.run({"temperature": 1.0}, **row))

    assert current.turns and stale.turns
    mixed = 0
    for out in outputs:
        record = EpisodeRecord.of(out)
        log = record.turn_log
        policies = log.policies
        assert len(policies) == record.turns == 6
        mixed += len(set(policies)) == 2
        assert log.versions == [9 if p == CURRENT else 8 for p in policies]
        assert log.stale_share == pytest.approx(policies.count(STALE) / 6)
        owners = log.token_policies(len(out.response_ids))
        for owner, mask, lp in zip(owners, out.response_mask, out.response_logprobs, strict=True):
            assert (owner is not None) == bool(mask)
            assert lp == {CURRENT: -0.25, STALE: -3.0, None: 0.0}[owner]
    assert mixed >= 2  # P(a 6-turn episode is unmixed) = 1/32


# ---- the stale pool launched beside verl's setup ----------------------------------------------------------------


def test_beside_setup_launches_once_ready_and_hands_back_the_result():
    ready, seen = threading.Event(), []
    launch = BesideSetup(ready.is_set, lambda: seen.append(ready.is_set()) or "pool", poll_s=0.001)
    assert not launch._done.wait(0.05) and seen == []  # not ready: nothing launched
    ready.set()
    assert launch.result() == "pool" and seen == [True]


def test_beside_setup_launches_on_release_without_ready_and_reraises_errors():
    def fail():
        raise OSError("no devices")

    launch = BesideSetup(lambda: False, fail, poll_s=0.001)
    with pytest.raises(OSError, match="no devices"):
        launch.result()  # result() releases: the launch runs though ready() never held


def test_beside_setup_cancelled_before_ready_never_launches():
    seen = []
    launch = BesideSetup(lambda: False, lambda: seen.append("launched"), poll_s=0.001)
    launch.cancel()
    assert launch.result() is None and seen == []


class _FakeStalePool:
    def __init__(self, config, num_replicas: int, start_rank: int, model_path: str = "") -> None:
        self.start_rank, self.num_replicas, self.connected = start_rank, num_replicas, None

    def connect(self, actor_wg) -> None:
        self.connected = actor_wg


class _FakeVerlTrainer:
    """verl's setup as the mixin sees it: the actor's pool is placed, then setup goes on (until the stale pool has
    started, proving the two overlap), then verl's own replicas exist."""

    replicas, fail = 1, False

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.config = OmegaConf.create({
            "agentrl": {"cross_policy": {"enable": True, "stale_replicas": 2}},
            "actor_rollout_ref": {"rollout": {"tensor_model_parallel_size": 1, "data_parallel_size": 1,
                                              "pipeline_model_parallel_size": 1}},
        })

    def _setup(self) -> None:
        self.mapping = {Role.ActorRollout: "global_pool"}
        pool = SimpleNamespace(pgs=None, world_size=1)
        self.resource_pool_manager = SimpleNamespace(resource_pool_dict={"global_pool": pool})
        if self.fail:
            raise RuntimeError("verl's setup failed")
        pool.pgs = ["placement group"]
        deadline = time.monotonic() + 30
        while "stale launched" not in self.events and time.monotonic() < deadline:
            time.sleep(0.001)
        self.events.append("verl setup done")
        self.llm_server_manager = SimpleNamespace(get_replicas=lambda: [object()] * self.replicas)
        self.actor_rollout_wg = "actor worker group"


class _Trainer(CrossPolicyTrainerMixin, _FakeVerlTrainer):
    pass


@pytest.fixture
def fake_stale_pool(monkeypatch):
    events: list[str] = []

    def launched(*args, **kwargs):
        events.append("stale launched")
        return _FakeStalePool(*args, **kwargs)

    monkeypatch.setattr(policy_pool, "StalePool", launched)
    return events


def test_stale_pool_starts_beside_verls_setup_after_the_actor_is_placed(fake_stale_pool):
    trainer = _Trainer(fake_stale_pool)
    trainer._setup()
    assert fake_stale_pool == ["stale launched", "verl setup done"]
    pool = trainer.stale_pool
    assert (pool.start_rank, pool.num_replicas, pool.connected) == (1, 2, "actor worker group")


def test_stale_pool_rank_must_follow_verls_replicas(fake_stale_pool):
    trainer = _Trainer(fake_stale_pool)
    trainer.replicas = 2
    with pytest.raises(RuntimeError, match="start at rank 1, but verl runs 2 replicas"):
        trainer._setup()


def test_stale_pool_is_not_launched_when_verls_setup_fails(fake_stale_pool):
    trainer = _Trainer(fake_stale_pool)
    trainer.fail = True
    with pytest.raises(RuntimeError, match="verl's setup failed"):
        trainer._setup()
    assert fake_stale_pool == [] and trainer.stale_pool is None
