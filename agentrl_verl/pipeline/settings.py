"""The pipeline's settings: tasks, warm-up, held-out evaluation and the verl run, typed and validated.

The embedded defaults are ``agentrl_verl/presets/demo_run.yaml`` (the default demo's); any YAML of the same
shape (``demo_multitask.yaml``) and ``KEY=VALUE`` overrides go through :func:`load_pipeline_config`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.models.tiny import TinyModelSpec
from agentrl_verl.pipeline.cold_start import WarmupConfig, device_setting

LAYERS = ("tiny", "smollm2")
"""The RL layers over main_ppo's primary config, ``+demo=<layer>`` (``agentrl_verl/presets/demo/<layer>.yaml``): the
settings of the tiny model's run and of SmolLM2-135M-Instruct's."""
ENGINES = {"hf": {"cpu": "cpu_tiny", "cuda": "gpu_tiny"}, "vllm": {"cpu": vllm_cpu.PRESET}}
"""Rollout engine -> device -> main_ppo's primary config (presets/). verl's vLLM rollout runs here on the CPU only
(``cpu_vllm``); on a GPU the demo serves with ``hf``."""
DEVICE_LAYERS = {"cuda": "+demo/device=gpu"}
"""Device -> the demo's layer for it, over :attr:`RLSpec.layer`'s (``presets/demo/device/``)."""
CPU_PLATFORM_ENV = {"AGENTRL_PLATFORM": "cpu", "VERL_PLATFORM": "cpu"}
"""What makes verl take the CPU platform on a host that has a GPU (agentrl_verl.backends.platform_cpu)."""


@dataclass
class TaskSpec:
    """One task of a run: a worker of the stack, its share of RL prompts and its held-out indices.

    A ``learnable`` task gets ``demonstrations`` expert episodes for the warm-up (default: the run's
    ``demonstrations``).
    """

    name: str
    family: str
    options: dict[str, Any] = field(default_factory=dict)
    concurrency: int = 16
    weight: float = 1.0
    held_out: int = 20
    learnable: bool = False
    demonstrations: int | None = None
    needs_docker: bool = False
    eval_repeats: int = 1
    """Sampled evaluation plays each held-out index this many times (for families with few items, e.g. db)."""

    def demonstration_count(self, default: int) -> int:
        """Expert episodes of the warm-up: 0 unless learnable, else :attr:`demonstrations` or ``default``."""
        return 0 if not self.learnable else default if self.demonstrations is None else self.demonstrations


@dataclass(frozen=True)
class ModelSpec(TinyModelSpec):
    """The model a run starts from: ``tiny`` (the tiny model, of the shape in the inherited fields), ``smollm2``
    (SmolLM2-135M-Instruct, :mod:`agentrl_verl.models.smollm2`), or the path of any Hugging Face model directory."""

    name: str = "tiny"

    def tiny_shape(self) -> TinyModelSpec:
        """The tiny model's shape and seed."""
        return TinyModelSpec(**{f.name: getattr(self, f.name) for f in fields(TinyModelSpec)})

    def path(self) -> Path:
        """The model's directory, known before it is built (a verl run can be launched with it and wait)."""
        from agentrl_verl.models.smollm2 import smollm2_path
        from agentrl_verl.models.tiny import tiny_model_path

        if self.name == "tiny":
            return tiny_model_path(spec=self.tiny_shape())
        return smollm2_path() if self.name == "smollm2" else Path(self.name).resolve()

    def build(self) -> Path:
        """Build (once, cached) ``tiny`` or ``smollm2``; check that a directory holds a model.

        Raises:
            ValueError: ``name`` is neither a known model nor a directory with a ``config.json``.
        """
        from agentrl_verl.models.smollm2 import build_smollm2
        from agentrl_verl.models.tiny import build_tiny_model

        if self.name == "tiny":
            return build_tiny_model(spec=self.tiny_shape())
        if self.name == "smollm2":
            return build_smollm2()
        if not (self.path() / "config.json").exists():
            raise ValueError(f"model.name={self.name!r}: not tiny, smollm2 or a Hugging Face model directory "
                             "(no config.json there)")
        return self.path()


@dataclass
class EvalSpec:
    """How held-out evaluation plays episodes (the training agent loop, see :mod:`agentrl_verl.tools.evaluate`)."""

    warmup_indices: int = 100
    base: bool = False
    """Also evaluate the model the run starts from, before its warm-up (zero-shot)."""
    sampled: bool = True
    temperature: float = 0.8
    max_turns: int = 4
    max_new_tokens: int = 48
    max_context: int = 640


@dataclass
class RLSpec:
    """The verl run: training steps, stall detection, its layer and extra Hydra overrides over it, the engine.

    ``stall_s`` is no limit on the run's length (its speed depends on the machine): the run is stopped only when it
    has neither finished a step nor printed a line for that long.
    """

    steps: int = 40
    stall_s: float = 900.0
    layer: str = "tiny"
    """The RL settings over the primary preset, one of :data:`LAYERS` (the model's: tiny or smollm2)."""
    overrides: list[str] = field(default_factory=list)
    engine: str = "hf"  # or "vllm": verl's vLLM rollout on CPU, run from .venv-vllm (bash scripts/setup.sh --vllm)
    device: str = "auto"  # cuda (one GPU: the trainer and both rollout replicas), cpu, or auto (cuda where torch sees
    # one and the engine serves there, unless AGENTRL_PLATFORM=cpu asks for verl's CPU platform)
    start_with_warmup: str = "auto"
    """Launch verl's run before the warm-up, which trains while verl starts (its trainer waits for the model):
    ``auto`` where the warm-up trains on a GPU (on a CPU the two would share the cores), ``true`` or ``false``."""

    def starts_with_warmup(self, warmup_device: str) -> bool:
        """:attr:`start_with_warmup` resolved for a warm-up on ``warmup_device`` (``warmup.device``).

        Raises:
            ValueError: not ``auto``, ``true`` or ``false``.
        """
        choice = str(self.start_with_warmup).lower()  # YAML's true arrives as "True"
        if choice == "auto":
            return device_setting(warmup_device, "warmup.device") == "cuda"
        if choice not in ("true", "false"):
            raise ValueError(f"rl.start_with_warmup={self.start_with_warmup!r}: use auto, true or false")
        return choice == "true"

    def resolved_device(self) -> str:
        """:attr:`device` resolved: ``auto`` is ``cuda`` where torch sees a GPU and the engine serves on one.

        Raises:
            ValueError: an unknown device, ``cuda`` without a GPU or with verl's CPU platform asked for, or an engine
                that does not serve on it.
        """
        if self.engine not in ENGINES:
            raise ValueError(f"rl.engine={self.engine!r}: use one of {', '.join(ENGINES)}")
        from agentrl_verl.backends.platform_cpu import cpu_platform_requested

        if self.device == "auto":
            if cpu_platform_requested() or "cuda" not in ENGINES[self.engine]:
                return "cpu"  # AGENTRL_PLATFORM=cpu (or VERL_PLATFORM=cpu) asks for the CPU on a GPU host too
            return device_setting("auto", "rl.device")
        device = device_setting(self.device, "rl.device")
        if device == "cuda" and cpu_platform_requested():
            raise ValueError("rl.device=cuda, but AGENTRL_PLATFORM/VERL_PLATFORM=cpu asks verl for its CPU platform: "
                             "unset it, or use rl.device=cpu")
        if device not in ENGINES[self.engine]:
            raise ValueError(f"rl.device={device} with rl.engine={self.engine}: the pipeline runs {self.engine} on "
                             f"{' or '.join(ENGINES[self.engine])} only; use rl.engine=hf on a GPU")
        return device

    def preset(self) -> str:
        """main_ppo's primary config for :attr:`engine` on :meth:`resolved_device` (``cpu_tiny``, ``gpu_tiny`` or
        ``cpu_vllm``)."""
        device = self.resolved_device()
        return ENGINES[self.engine][device]

    def layers(self) -> list[str]:
        """The layers on :meth:`preset`: ``+demo=<layer>``, then the device's (:data:`DEVICE_LAYERS`).

        Raises:
            ValueError: an unknown :attr:`layer`.
        """
        if self.layer not in LAYERS:
            raise ValueError(f"rl.layer={self.layer!r}: use one of {', '.join(LAYERS)}")
        device = self.resolved_device()
        return [f"+demo={self.layer}", *([DEVICE_LAYERS[device]] if device in DEVICE_LAYERS else [])]

    def platform_env(self) -> dict[str, str]:
        """Environment of the verl run: on the CPU, verl's CPU platform also where a GPU is present."""
        return dict(CPU_PLATFORM_ENV) if self.resolved_device() == "cpu" else {}


@dataclass
class WarmupSpec(WarmupConfig):
    """The warm-up: :class:`~agentrl_verl.pipeline.cold_start.WarmupConfig`'s training settings, and whether
    to reuse a model that an earlier run with the same settings left in the cache."""

    reuse: bool = False
    """Reuse (or else train and keep) the warm-up model cached under ``$AGENTRL_CACHE_DIR/<cache>/`` for exactly
    these settings (:func:`agentrl_verl.pipeline.warmup.warmup_settings`). Off: every run trains its own warm-up
    into its output directory."""

    def model_settings(self) -> dict[str, Any]:
        """The settings that shape the warmed-up model (all but :attr:`reuse`)."""
        return {k: v for k, v in asdict(self).items() if k != "reuse"}


@dataclass
class PipelineConfig:
    """A run of the pipeline: the model it starts from, its tasks, the warm-up's demonstrations and settings, the
    held-out evaluation and the verl run."""

    seed: int = 0
    tasks: list[TaskSpec] = field(default_factory=list)
    demonstrations: int = 2000
    warmup: WarmupSpec = field(default_factory=WarmupSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    rl: RLSpec = field(default_factory=RLSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    """The model the run starts from (built once and cached)."""


def load_pipeline_config(path: str | os.PathLike | None = None,
                         overrides: list[str] | None = None) -> PipelineConfig:
    """The run's settings: the embedded ``demo_run.yaml`` (or ``path``) with ``KEY=VALUE`` overrides, validated.

    Raises:
        ValueError: an unknown key or a value of the wrong type, named in the message.
    """
    default = resources.files("agentrl_verl.presets") / "demo_run.yaml"
    text = Path(path).read_text() if path else default.read_text()
    try:
        schema = OmegaConf.structured(PipelineConfig)
        OmegaConf.set_readonly(schema.model, False)  # ModelSpec is frozen (a TinyModelSpec); its fields are settings
        merged = OmegaConf.merge(schema, OmegaConf.create(text))
        for override in overrides or []:
            key, sep, value = override.partition("=")
            if not sep:
                raise ValueError(f"override {override!r} is not KEY=VALUE")
            # update (not a dotlist merge) so that list items can be addressed: tasks.0.held_out=50
            OmegaConf.update(merged, key, yaml.safe_load(value), merge=True)
    except Exception as e:  # omegaconf raises several unrelated types for bad keys and values
        raise ValueError(f"invalid run settings ({path or 'demo_run.yaml'}, overrides {overrides}): {e}") from e
    config: PipelineConfig = OmegaConf.to_object(merged)
    if not any(t.learnable for t in config.tasks):
        raise ValueError("a run needs one task with learnable: true (it gets the warm-up demonstrations)")
    config.rl.starts_with_warmup(config.warmup.device)  # a bad value stops here, not after the stack is up
    return config
