"""The GPU recipes, the demo's RL preset and the examples compose with Hydra, use only keys that exist, and pass
verl's own config validation and our option parsers (nothing here starts a run); the example task works."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import subprocess
from pathlib import Path

import pytest
import ray
import verl  # noqa: F401 - loads our plugin, which registers the estimator, agent loop and trainer modes
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
from verl.utils.config import validate_config

from agentrl_verl.backends.hf_rollout.adapter import HF_ENGINE_KWARGS, ROLLOUT_ENGINE_KEY
from agentrl_verl.core.config import ConfigError, validate_run_config
from agentrl_verl.presets import CONFIG_DIR
from env_adapters.launcher import load_config
from env_adapters.protocol import SampleStatus
from env_adapters.task import InvalidAction, get_task_class

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "agentrl"
SIZES = ["3b", "7b", "14b", "32b"]
# Stand-ins for the values a launch script passes (the configs leave them ??? on purpose).
REQUIRED = ["agentrl.env.url=http://127.0.0.1:5020", "data.train_files=train.parquet", "data.val_files=val.parquet"]
MISSING = object()
RAY_INIT = "ray_kwargs.ray_init."
HF_KWARGS = f"actor_rollout_ref.rollout.engine_kwargs.{ROLLOUT_ENGINE_KEY}."


def _compose(config_dir: Path | str, name: str, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name=name, overrides=overrides)


@pytest.fixture(scope="module")
def verl_base() -> DictConfig:
    """verl's own ppo_trainer, the reference of which keys exist."""
    return _compose(Path(verl.__file__).parent / "trainer" / "config", "ppo_trainer", [])


def _leaf_keys(node, prefix: str = "") -> list[str]:
    if isinstance(node, DictConfig):
        return [k for key, value in node.items_ex(resolve=False) for k in _leaf_keys(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def _unknown_keys(files: list[Path], base: DictConfig) -> list[str]:
    """Keys set in ``files`` (outside hydra/defaults and our agentrl namespace) that verl's config lacks."""
    plain = OmegaConf.to_container(base, resolve=False)  # keeps ??? values as strings: present, just unset
    unknown = []
    for path in files:
        for key in _leaf_keys(OmegaConf.load(path)):
            if key.split(".")[0] in ("hydra", "defaults", "agentrl"):
                continue
            if key.startswith(RAY_INIT):  # main_ppo hands these to ray.init as they are
                if key.removeprefix(RAY_INIT) not in inspect.signature(ray.init).parameters:
                    unknown.append(f"{path.name}: {key}")
                continue
            if key.startswith(HF_KWARGS):  # the hf rollout backend's own
                if key.removeprefix(HF_KWARGS) not in HF_ENGINE_KWARGS:
                    unknown.append(f"{path.name}: {key}")
                continue
            node = plain
            for part in key.split("."):
                node = node.get(part, MISSING) if isinstance(node, dict) else MISSING
            if node is MISSING:
                unknown.append(f"{path.name}: {key}")
    return unknown


def _check_run_config(config: DictConfig) -> None:
    """What main_ppo and our components would check when the run starts."""
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert get_adv_estimator_fn(config.algorithm.adv_estimator) is not None
    assert config.trainer.v1.trainer_mode in TRAINER_REGISTRY
    validate_run_config(config)  # what the agentrl_sync / agentrl_async trainers do first


@pytest.mark.parametrize("size", SIZES)
def test_recipe_composes_with_existing_keys(size, verl_base):
    config = _compose(RECIPE / "config", f"agentrl_qwen2.5_{size}", REQUIRED)
    assert _unknown_keys([RECIPE / "config" / "agentrl_base.yaml", RECIPE / "config" / f"agentrl_qwen2.5_{size}.yaml"],
                         verl_base) == []
    _check_run_config(config)
    # The paper's hyperparameters reached the composed config.
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (config.data.train_batch_size, rollout.n, actor.optim.lr, actor.kl_loss_coef) == (256, 8, 1e-6, 1e-4)
    clips = (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c)
    assert clips == (0.2, 0.2, 3.0) and rollout.temperature == 0.8
    assert config.algorithm.adv_estimator == "task_norm_grpo" and config.agentrl.cross_policy.stale_ratio == 0.25
    assert config.trainer.total_training_steps == 1000
    assert config.data.max_prompt_length + config.data.max_response_length == config.agentrl.agent.max_total_tokens
    assert config.trainer.v1.trainer_mode == "agentrl_async"  # the paper's pipeline; agentrl_sync is an override


def test_the_one_gpu_recipe_keeps_the_papers_method_with_every_replica_on_the_card(verl_base):
    config = _compose(RECIPE / "config", "agentrl_1gpu", [*REQUIRED, "actor_rollout_ref.model.path=/m"])
    assert _unknown_keys([RECIPE / "config" / "agentrl_1gpu.yaml"], verl_base) == []
    _check_run_config(config)
    paper = _compose(RECIPE / "config", "agentrl_qwen2.5_3b", REQUIRED)
    _check_run_config(paper)  # fills in the agentrl defaults, as it did above
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    for key in ("algorithm.adv_estimator", "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.n",
                "actor_rollout_ref.rollout.temperature", "agentrl.cross_policy", "agentrl.agent", "trainer.v1"):
        assert OmegaConf.select(config, key) == OmegaConf.select(paper, key), key
    assert config.data.train_batch_size // actor.ppo_mini_batch_size == 4  # updates per step, as in the paper's
    # One card that Ray counts twice: the trainer's replica and the stale pool's, both served on the card, weights
    # to the stale copy through the object store (NCCL cannot join two ranks on one card).
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (1, 1)
    stale = config.agentrl.cross_policy.stale_replicas
    assert config.ray_kwargs.ray_init.num_gpus == config.trainer.n_gpus_per_node + stale
    assert rollout.name == "hf" and rollout.dtype == "bfloat16" and rollout.engine_kwargs.hf.physical_gpus == 1
    assert rollout.checkpoint_engine.backend == "ray_object_store"


def test_the_recipe_on_sglang_says_at_launch_what_the_async_pipeline_needs():
    config = _compose(RECIPE / "config", "agentrl_qwen2.5_7b", [*REQUIRED, "actor_rollout_ref.rollout.name=sglang"])
    with pytest.raises(ConfigError, match=re.escape("+agentrl.async.interrupt=true")):
        validate_run_config(config)
    _check_run_config(_compose(RECIPE / "config", "agentrl_qwen2.5_7b",
                               [*REQUIRED, "actor_rollout_ref.rollout.name=sglang", "+agentrl.async.interrupt=true"]))


def test_demo_preset_composes_with_existing_keys():
    cpu_tiny = _compose(CONFIG_DIR, "cpu_tiny", [])  # the preset the demo layers on (it adds Ray's num_gpus)
    config = _compose(CONFIG_DIR, "cpu_tiny", ["+demo=tiny", "actor_rollout_ref.model.path=/m", *REQUIRED])
    assert _unknown_keys([Path(CONFIG_DIR) / "demo" / "tiny.yaml"], cpu_tiny) == []
    _check_run_config(config)
    assert config.actor_rollout_ref.rollout.name == "hf" and config.agentrl.cross_policy.enable


def test_the_gpu_demo_preset_is_the_cpu_one_with_every_replica_on_the_card():
    layer = ["+demo=tiny", "actor_rollout_ref.model.path=/m", *REQUIRED]
    cpu, gpu = _compose(CONFIG_DIR, "cpu_tiny", layer), _compose(CONFIG_DIR, "gpu_tiny", layer)
    _check_run_config(_compose(CONFIG_DIR, "gpu_tiny", layer))
    assert gpu.trainer.device == "cuda" and gpu.actor_rollout_ref.rollout.engine_kwargs.hf.physical_gpus == 1
    # Ray counts the card once per replica (the stale pool's too); every other setting is the CPU run's.
    assert gpu.ray_kwargs.ray_init.num_gpus == 1 + gpu.agentrl.cross_policy.stale_replicas
    cpu, gpu = OmegaConf.to_container(cpu), OmegaConf.to_container(gpu)
    for config in (cpu, gpu):
        config["trainer"].pop("device")
        config["actor_rollout_ref"]["rollout"]["engine_kwargs"]["hf"].pop("physical_gpus", None)
    assert cpu == gpu


def test_environment_config_is_valid():
    config = load_config(RECIPE / "env" / "agentbench_fc.yaml")
    names = {w.name for w in config.workers}
    # Every task prepare_data.sh asks the controller for, each a family this project implements.
    asked = set(re.findall(r"--task (\S+)", (RECIPE / "prepare_data.sh").read_text()))
    assert names == asked == {"os-std", "dbbench-std", "kg-std", "webshop-std", "alfworld-std"}
    for worker in config.workers:
        get_task_class(worker.task)
    # Reachable off-host, so it needs a token, which the training side reads from the same file.
    assert config.controller.host == "0.0.0.0" and config.controller.token_file and not config.controller.token
    assert "agentrl.env.token_file=" in (RECIPE / "run.sh").read_text()
    assert "--token-file" in (RECIPE / "prepare_data.sh").read_text()


UPSTREAM_PARAMETERS = ("AGENTBENCH", "FREEBASE_SPARQL", "ALFWORLD_DATA", "WEBSHOP_DATA", "MYSQL_URL")


def test_the_upstream_data_environment_serves_the_same_tasks_from_parameters(monkeypatch):
    generated = load_config(RECIPE / "env" / "agentbench_fc.yaml")
    upstream_file = RECIPE / "env" / "agentbench_fc_upstream.yaml"
    monkeypatch.delenv("AGENTBENCH", raising=False)
    with pytest.raises(ValueError, match=r"uses \$\{AGENTBENCH\}, which is not set"):
        load_config(upstream_file)
    for name in UPSTREAM_PARAMETERS:
        monkeypatch.setenv(name, f"/{name.lower()}")
    upstream = load_config(upstream_file)
    assert [(w.task, w.name, w.ray) for w in upstream.workers] == [(w.task, w.name, w.ray) for w in generated.workers]
    assert upstream.controller.model_dump() == generated.controller.model_dump()
    for worker in upstream.workers:  # every option is one its family takes (the data itself is not here)
        accepted = inspect.signature(get_task_class(worker.task)).parameters
        assert set(worker.options) <= set(accepted), (worker.task, set(worker.options) - set(accepted))
    options = {w.task: w.options for w in upstream.workers}
    assert options["os"]["data"][5] == {"problem_file": "/agentbench/data/os_interaction/data/6/*.json",
                                        "script_dir": "/agentbench/data/os_interaction/scripts/6/"}
    assert (options["kg"]["backend"], options["kg"]["sparql_url"]) == ("endpoint", "/freebase_sparql")
    assert options["webshop"]["catalogue"] == "/webshop_data" and options["alfworld"]["data_path"] == "/alfworld_data"


def test_launch_scripts_parse_and_explain_their_arguments():
    for script in ("run.sh", "prepare_data.sh"):
        assert subprocess.run(["bash", "-n", str(RECIPE / script)]).returncode == 0
        res = subprocess.run(["bash", str(RECIPE / script)], capture_output=True, text=True)
        assert res.returncode == 2 and "bash recipes/agentrl/" in res.stdout
    res = subprocess.run(["bash", str(RECIPE / "run.sh"), "9b", "m", "u", "d"], capture_output=True, text=True)
    assert res.returncode == 2 and "SIZE must be" in res.stderr


# ---- examples ---------------------------------------------------------------------------------------------


def _call(name: str, **arguments) -> dict:
    import json

    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def test_example_task_plays_by_the_task_api(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    task = get_task_class("add_a_task:ReverseTask")(size=5)  # how a worker loads it (--task add_a_task:ReverseTask)

    async def play(answer_from_tool: bool):
        session = await task.start_session(3)
        opening = await session.reset()
        word = opening.messages[0]["content"].split("'")[1]
        tool = await session.step(_call("reverse", text=word))
        assert tool.status is SampleStatus.RUNNING and tool.messages[0]["content"] == word[::-1]
        answer = tool.messages[0]["content"] if answer_from_tool else word
        return await session.step(_call("submit", answer=answer))

    right, wrong = asyncio.run(play(True)), asyncio.run(play(False))
    assert (right.status, right.reward) == (SampleStatus.COMPLETED, 1.0)
    assert (wrong.status, wrong.reward) == (SampleStatus.COMPLETED, 0.0)
    with pytest.raises(InvalidAction):
        asyncio.run(asyncio.run(task.start_session(0)).step({"role": "assistant", "content": "hi"}))


def test_verl_overrides_example_composes_on_plain_verl(tmp_path, verl_base):
    """Run the example script with a stand-in ``python3`` that records its arguments, then compose those."""
    fake = tmp_path / "python3"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done > "$ARGS_FILE"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "ARGS_FILE": str(tmp_path / "args")}
    script = ROOT / "examples" / "verl_overrides.sh"
    pipeline = [  # what any existing verl pipeline already sets (verl has no defaults for these)
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4"]
    subprocess.run(["bash", str(script), "/models/qwen", "http://127.0.0.1:5020", "/data", *pipeline], env=env,
                   check=True)
    args = (tmp_path / "args").read_text().splitlines()
    assert args[:2] == ["-m", "verl.trainer.main_ppo"]
    config = _compose(Path(verl.__file__).parent / "trainer" / "config", "ppo_trainer", args[2:])
    _check_run_config(config)
    assert config.algorithm.adv_estimator == "task_norm_grpo"
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "agentrl_agent"
