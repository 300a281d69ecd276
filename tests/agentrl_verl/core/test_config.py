"""The one ``agentrl`` config tree: defaults, typo and type errors, contradictions, write-back, the docs' table."""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agentrl_verl.core.config import (
    AgentConfig,
    AgentRLConfig,
    AsyncConfig,
    ConfigError,
    Endpoint,
    StalePolicy,
    TaskAdvNorm,
    agentrl_config,
    check_run,
    config_table,
    load_agentrl,
    validate_run_config,
    with_overrides,
)

CONFIG_PAGE = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def test_defaults_are_upstream():
    config = load_agentrl(None)
    assert config == AgentRLConfig() == load_agentrl({})
    assert config.agent == AgentConfig(max_turns=20, max_total_tokens=8192, max_new_tokens=1024, penalty=-0.2)
    assert config.task_adv_norm is TaskAdvNorm.TOKEN
    cp = config.cross_policy
    assert (cp.enable, cp.stale_ratio, cp.stale_refresh_steps, cp.sticky, cp.endpoints) == (False, 0.25, 25, False, ())
    assert (config.async_.max_staleness, config.async_.stale_policy, config.async_.interrupt) == (
        1, StalePolicy.WAIT, False)
    assert config.env.url is None


def test_parses_a_full_tree():
    config = load_agentrl(OmegaConf.create({
        "env": {"url": "http://h:1", "token": "t"},
        "agent": {"max_turns": 4, "penalty": 0},  # an int where a float is expected is widened
        "task_adv_norm": False,  # YAML's bare `off`
        "cross_policy": {"enable": True, "endpoints": [
            {"name": "m0", "base_url": "http://127.0.0.1:1/v1", "model": "tiny0"},
            {"name": "m1", "base_url": "http://127.0.0.1:2/v1", "model": "tiny1", "weight": 3}]},
        "async": {"max_staleness": 2, "stale_policy": "DROP", "buffer_capacity": 5},
    }))
    assert config.agent.max_turns == 4 and config.agent.penalty == 0.0 and config.env.token == "t"
    assert config.task_adv_norm is TaskAdvNorm.OFF
    assert config.cross_policy.endpoints[1] == Endpoint("m1", "http://127.0.0.1:2/v1", "tiny1", weight=3.0)
    assert config.cross_policy.endpoint_pool() == {"m0": 1.0, "m1": 3.0}
    assert config.async_.stale_policy is StalePolicy.DROP and config.async_.capacity(batch_groups=4) == 5


@pytest.mark.parametrize("value, expected", [
    (False, TaskAdvNorm.OFF), ("off", TaskAdvNorm.OFF), (True, TaskAdvNorm.TOKEN), ("on", TaskAdvNorm.TOKEN),
    (" Trajectory ", TaskAdvNorm.TRAJECTORY)])
def test_task_adv_norm_spellings(value, expected):
    assert load_agentrl({"task_adv_norm": value}).task_adv_norm is expected


@pytest.mark.parametrize("section, message", [
    # Typos anywhere in the tree, with the nearest valid key.
    ({"cross_polcy": {"enable": True}}, "unknown key agentrl.cross_polcy: did you mean agentrl.cross_policy?"),
    ({"asyn": {"max_staleness": 2}}, "unknown key agentrl.asyn: did you mean agentrl.async?"),
    ({"agent": {"max_turn": 3}}, "unknown key agentrl.agent.max_turn: did you mean agentrl.agent.max_turns?"),
    ({"async": {"max_stalenes": 1}}, "did you mean agentrl.async.max_staleness?"),
    ({"cross_policy": {"endpoints": [{"nme": "a", "base_url": "u", "model": "m"}]}},
     "unknown key agentrl.cross_policy.endpoints[0].nme: did you mean agentrl.cross_policy.endpoints[0].name?"),
    ({"zzz": 1},
     "unknown key agentrl.zzz: valid keys: agent, async, cross_policy, env, start_model_wait_s, task_adv_norm"),
    # Wrong types (no silent coercion of strings or booleans into numbers).
    ({"agent": {"max_turns": "3"}}, "agentrl.agent.max_turns='3': Input should be a valid integer"),
    ({"agent": {"penalty": True}}, "agentrl.agent.penalty=True: Input should be a valid number"),
    ({"cross_policy": {"enable": "yes"}}, "agentrl.cross_policy.enable='yes': Input should be a valid boolean"),
    ({"agent": 3}, "agentrl.agent=3"),
    # Out-of-range and invalid values.
    ({"agent": {"max_turns": 0}}, "agentrl.agent.max_turns=0: Input should be greater than or equal to 1"),
    ({"cross_policy": {"stale_ratio": 1.5}}, "agentrl.cross_policy.stale_ratio=1.5"),
    ({"cross_policy": {"stale_refresh_steps": 0}}, "agentrl.cross_policy.stale_refresh_steps=0"),
    ({"cross_policy": {"endpoints": [{"name": "a", "base_url": "u", "model": "m"}] * 2}}, "names must be unique"),
    ({"cross_policy": {"endpoints": [{"name": "a"}]}}, "agentrl.cross_policy.endpoints[0].base_url is required"),
    ({"async": {"max_staleness": -1}}, "agentrl.async.max_staleness=-1"),
    ({"async": {"stale_policy": "sometimes"}}, "Input should be 'wait', 'drop' or 'keep'"),
    ({"async": {"buffer_capacity": 0}}, "agentrl.async.buffer_capacity=0"),
    ({"async": {"max_inflight": 0}}, "agentrl.async.max_inflight=0"),
    ({"async": {"poll_interval": 0}}, "agentrl.async.poll_interval=0"),
    ({"task_adv_norm": "sometimes"}, "use one of off, on, token, trajectory"),
])
def test_bad_keys_and_values_are_named(section, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_agentrl(section)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as error:
        load_agentrl({"agent": {"max_turn": 3, "penalty": "x"}, "asyn": {}})
    assert all(key in str(error.value) for key in ("agent.max_turn", "agent.penalty", "agentrl.asyn"))


def test_overrides_of_one_section_are_validated():
    agent = AgentConfig()
    assert with_overrides(agent, {}, "agentrl.agent") is agent
    assert with_overrides(agent, {"max_turns": 3}, "agentrl.agent") == AgentConfig(max_turns=3)
    with pytest.raises(ConfigError, match=re.escape("unknown key agentrl.agent.turns: did you mean")):
        with_overrides(agent, {"turns": 3}, "agentrl.agent")


def test_capacity_below_one_batch_is_an_error():
    assert AsyncConfig().capacity(batch_groups=4) == 8
    assert AsyncConfig(max_staleness=3).capacity(batch_groups=4) == 16  # never below what the bound admits
    with pytest.raises(ConfigError, match="smaller than one training batch"):
        AsyncConfig(buffer_capacity=3).capacity(batch_groups=4)


def _run(agentrl=None, **verl):
    config = {"algorithm": {"adv_estimator": "task_norm_grpo"}, "data": {"train_batch_size": 4},
              "trainer": {"v1": {"trainer_mode": "agentrl_sync"}},
              "actor_rollout_ref": {"rollout": {"agent": {"default_agent_loop": "agentrl_agent"},
                                                "checkpoint_engine": {"backend": "naive"}}}}
    config = OmegaConf.merge(config, OmegaConf.from_dotlist([f"{k}={v}" for k, v in verl.items()]))
    config.agentrl = agentrl if agentrl is not None else {"env": {"url": "http://h:1"}}
    return config


@pytest.mark.parametrize("agentrl, verl, message", [
    ({"env": {"url": "http://h"}, "async": {"stale_policy": "keep"}}, {},
     "agentrl.async.stale_policy=keep trains groups beyond the staleness bound"),
    ({"env": {"url": "http://h"}, "async": {"buffer_capacity": 2}}, {"trainer.v1.trainer_mode": "agentrl_async"},
     "agentrl.async.buffer_capacity=2 is smaller than one training batch"),
    ({"env": {"url": "http://h"}, "cross_policy": {"enable": True}}, {},
     "the 'naive' checkpoint engine cannot reach"),
    ({"env": {"url": "http://h"}, "cross_policy": {"enable": True, "endpoints": [
        {"name": "a", "base_url": "u", "model": "m"}]}},
     {"actor_rollout_ref.rollout.checkpoint_engine.backend": "ray_object_store"}, "endpoints is for evaluation"),
    ({}, {}, "agentrl_agent needs the controller address: set +agentrl.env.url"),
    (None, {"reward.num_workers": 0, "actor_rollout_ref.rollout.agent.default_agent_loop": "single_turn_agent"},
     "reward.num_workers=0 starts no reward worker, which only agentrl_agent episodes do without"),
    ({"env": {"launch": "ray"}}, {}, "agentrl.env.launch=ray starts the stack of agentrl.env.stack: set it"),
    ({"env": {"launch": "ray", "stack": "env/stack.yaml"}}, {}, "must be an absolute path"),
    ({"env": {"launch": "ray", "stack": "/s.yaml", "url": "http://h"}}, {}, "remove agentrl.env.url"),
])
def test_contradictions_stop_the_launch(agentrl, verl, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_run_config(_run(agentrl, **verl))


@pytest.mark.parametrize("engine", ["hf", "vllm", "sglang"])
@pytest.mark.parametrize("mode", ["agentrl_sync", "agentrl_async"])
@pytest.mark.parametrize("interrupt", [False, True])
def test_every_engine_mode_and_interrupt_is_supported_or_refused_at_launch(engine, mode, interrupt):
    run = _run({"env": {"url": "http://h"}, "async": {"interrupt": interrupt}},
               **{"actor_rollout_ref.rollout.name": engine, "trainer.v1.trainer_mode": mode})
    if engine == "sglang" and mode == "agentrl_async" and not interrupt:
        # verl 0.9.1's SGLang server can only abort: the message names what works instead.
        with pytest.raises(ConfigError, match=re.escape("set +agentrl.async.interrupt=true")) as error:
            validate_run_config(run)
        assert "rollout.name=hf or vllm" in str(error.value)
    else:
        assert validate_run_config(run).async_.interrupt is interrupt


def test_a_token_file_is_read_and_checked_at_launch(tmp_path):
    token_file = tmp_path / "env.token"
    token_file.write_text("s3cret\n")
    config = validate_run_config(_run({"env": {"url": "http://h", "token_file": str(token_file)}}))
    assert config.env.resolved_token() == "s3cret"
    with pytest.raises(ConfigError, match=re.escape("agentrl.env.token_file: cannot read the token file")):
        validate_run_config(_run({"env": {"url": "http://h", "token_file": str(tmp_path / "missing")}}))
    with pytest.raises(ConfigError, match="not both"):
        validate_run_config(_run({"env": {"url": "http://h", "token": "a", "token_file": str(token_file)}}))


def test_a_run_that_starts_its_stack_needs_no_url():
    run = _run({"env": {"launch": "ray", "stack": {"workers": [{"task": "calc"}]}}})
    assert validate_run_config(run).env.stack == {"workers": [{"task": "calc"}]}
    assert validate_run_config(_run({"env": {"launch": "ray", "stack": "~/stack.yaml"}})).env.launch == "ray"


def test_consistent_combinations_pass():
    keep = _run({"env": {"url": "http://h"}, "async": {"stale_policy": "keep"}},
                **{"algorithm.rollout_correction.rollout_is": "token"})
    assert validate_run_config(keep).async_.stale_policy is StalePolicy.KEEP
    check_run(load_agentrl({}), _run(**{"actor_rollout_ref.rollout.agent.default_agent_loop": "single_turn_agent"}))
    assert validate_run_config(_run(**{"reward.num_workers": 0})).env.url == "http://h:1"  # the environment scores


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The tiny model, a copy with another tokenizer, one whose embedding is too small, a directory without config."""
    import json
    import shutil

    from transformers import AutoTokenizer

    from agentrl_verl.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("fixed_models")
    actor = build_tiny_model()
    other = root / "other_tokenizer"
    shutil.copytree(actor, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<not_in_the_actor>"])
    tokenizer.save_pretrained(other)
    small = root / "small_embedding"
    shutil.copytree(actor, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 1024}))
    (root / "empty").mkdir()
    return {"actor": actor, "other": other, "small": small, "empty": root / "empty"}


def _fixed(models, name: str, enable: bool = True):
    return _run({"env": {"url": "http://h"},
                 "cross_policy": {"enable": enable, "fixed_model_path": str(models[name])}},
                **{"actor_rollout_ref.model.path": str(models["actor"])})


def test_fixed_model_must_be_a_model_directory_with_the_actors_tokenizer(models):
    with pytest.raises(ConfigError, match=r"fixed_model_path=.*empty is not a Hugging Face model directory"):
        validate_run_config(_fixed(models, "empty"))
    with pytest.raises(ConfigError, match=r"fixed_model_path=.*other_tokenizer has another tokenizer than the actor "
                                          r"\(2049 tokens, the actor's 2048"):
        validate_run_config(_fixed(models, "other"))
    with pytest.raises(ConfigError, match="small_embedding has vocab_size 1024 in config.json, fewer than its "
                                          "tokenizer's 2048 tokens"):
        validate_run_config(_fixed(models, "small"))
    # The actor's own model as the fixed member passes, on the naive checkpoint engine too (nothing is synced).
    assert validate_run_config(_fixed(models, "actor")).cross_policy.fixed_model_path == str(models["actor"])


def test_fixed_model_without_cross_policy_is_a_warning(models, caplog):
    with caplog.at_level("WARNING", logger="agentrl_verl.core.config"):
        validate_run_config(_fixed(models, "empty", enable=False))  # not checked either: it is not used
    assert "fixed_model_path has no effect with agentrl.cross_policy.enable=false" in caplog.text


def test_driver_writes_the_complete_tree_back_for_the_workers():
    run = _run({"env": {"url": "http://h"}, "agent": {"max_turns": 3}, "task_adv_norm": False})
    OmegaConf.set_struct(run, True)
    config = validate_run_config(run)
    assert run.agentrl.agent.max_new_tokens == 1024 and run.agentrl.task_adv_norm == "off"
    assert run.agentrl["async"].stale_policy == "wait"
    assert agentrl_config(run) is config  # read once per config object
    # A worker process receives the written tree (a copy) and reads the same values.
    assert agentrl_config(OmegaConf.create(OmegaConf.to_container(run))) == config


def test_the_docs_table_is_the_config():
    rows = [line for line in CONFIG_PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| `agentrl.")]
    assert "\n".join(rows) == config_table(), f"docs/config.md's agentrl.* rows must be exactly:\n{config_table()}"

