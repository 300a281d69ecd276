"""The ``agentrl`` config: one typed tree of every AgentRL option, validated once.

Every option and its default is declared here and nowhere else::

    agentrl:
      env:           EnvConfig          controller address and token
      agent:         AgentConfig        episode limits and penalty (the agent loop)
      task_adv_norm: TaskAdvNorm        per-task advantage normalisation (the estimator)
      cross_policy:  CrossPolicyConfig  cross-policy sampling (router, stale pool, evaluation endpoints)
      async:         AsyncConfig        the asynchronous pipeline (staleness bound, buffer)

:func:`validate_run_config` reads the tree from verl's run config on the driver before any worker starts (the
``agentrl_sync`` and ``agentrl_async`` trainers call it first): an unknown key or section anywhere under
``agentrl``, a value of the wrong type or range, or a contradictory combination with verl's own keys stops the
launch with a :class:`ConfigError` that names each bad key and, for a misspelt one, the nearest valid key. It writes
the complete validated tree back, so every Ray worker receives exactly what the driver checked and reads it through
:func:`agentrl_config`. The table of ``agentrl.*`` keys in ``docs/config.md`` is :func:`config_table` (a test keeps
them equal).

Pure Python (pydantic dataclasses): no verl, Ray or torch (the check of a fixed pool model's tokenizer loads
transformers).
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import threading
import typing
import weakref
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr, TypeAdapter
from pydantic import ValidationError as _PydanticValidationError
from pydantic.dataclasses import dataclass

from env_adapters.http import read_token_file

logger = logging.getLogger(__name__)

ROOT = "agentrl"
AGENT_NAME = "agentrl_agent"
ASYNC_TRAINER_MODE = "agentrl_async"
"""The agent loop name :mod:`.agent_loop` registers with verl (also the ``agent_name`` of dataset rows)."""
ESTIMATOR_NAME = "task_norm_grpo"
"""The advantage estimator name :mod:`.trainer` registers with verl."""

_STRICT = ConfigDict(extra="forbid", populate_by_name=True)
StrictFloat = Annotated[float, Strict()]  # an int is accepted (widened), a bool or a string is not


class ConfigError(ValueError):
    """An invalid ``agentrl`` config; the message names every bad key."""


# ---- the sections ---------------------------------------------------------------------------------------------


class TaskAdvNorm(str, Enum):
    """How the estimator takes each task's statistics (``agentrl.task_adv_norm``)."""

    OFF = "off"
    TOKEN = "token"
    TRAJECTORY = "trajectory"

    @classmethod
    def parse(cls, value: str | bool | TaskAdvNorm | None) -> TaskAdvNorm:
        """Read the option; YAML turns a bare ``off`` / ``on`` into booleans, so ``False`` is off and ``True`` or
        ``"on"`` mean ``token`` (the upstream behaviour).

        Raises:
            ValueError: ``value`` is none of ``off``, ``on``, ``token``, ``trajectory`` (or a bool).
        """
        if isinstance(value, cls):
            return value
        if value is None or value is False:
            return cls.OFF
        if value is True:
            return cls.TOKEN
        text = str(value).strip().lower()
        try:
            return cls.TOKEN if text == "on" else cls(text)
        except ValueError:
            raise ValueError(f"{value!r} is not valid; use one of off, on, token, trajectory") from None


class StalePolicy(str, Enum):
    """What happens to a group whose lag reaches the staleness bound before it is trained."""

    WAIT = "wait"
    DROP = "drop"
    KEEP = "keep"


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


@dataclass(frozen=True, config=_STRICT)
class EnvConfig:
    """``agentrl.env``: where the agent loop finds the environment controller, or the stack the run starts."""

    url: StrictStr | None = Field(None, description="controller address used by `agentrl_agent`",
                                  json_schema_extra={"doc_default": "required (or `launch: ray`)"})
    launch: Literal["url", "ray"] = Field(
        "url", description="`url`: use the controller at `url`; `ray`: start `stack` on the run's Ray cluster before "
        "step 1 and stop it at the end")
    stack: StrictStr | dict[str, Any] | None = Field(
        None, description="with `launch: ray`: the stack config, an absolute YAML path (verl's task runner may run "
        "on another node or folder) or the mapping itself")
    startup_timeout: StrictFloat = Field(300.0, gt=0,
                                         description="with `launch: ray`: seconds for the stack to come up")
    outage_timeout_s: StrictFloat = Field(
        900.0, gt=0, description="an episode the environment lost (unreachable, or its session gone) is played "
        "again on the same prompt for up to this long; then the run stops with an error")
    token: StrictStr | None = Field(None, description="controller token")
    token_file: StrictStr | None = Field(None, description="file holding the controller token (read on every node; "
                                         "what `agentrl-env up` writes for `controller.token_file`)")

    def __post_init__(self) -> None:
        if self.token and self.token_file:
            raise ValueError("set agentrl.env.token or agentrl.env.token_file, not both")
        if self.launch == "ray" and not self.stack:
            raise ValueError("agentrl.env.launch=ray starts the stack of agentrl.env.stack: set it to a stack YAML")
        if isinstance(self.stack, str) and not Path(self.stack).expanduser().is_absolute():
            raise ValueError(f"agentrl.env.stack={self.stack} must be an absolute path (verl's task runner may run in "
                             f"another folder or on another node): e.g. $(realpath {self.stack})")

    def resolved_token(self) -> str | None:
        """The controller token: ``token``, else the content of ``token_file``, else None.

        Raises:
            ValueError: ``token_file`` cannot be read or is empty.
        """
        return self.token or (read_token_file(self.token_file) if self.token_file else None)


@dataclass(frozen=True, config=_STRICT)
class AgentConfig:
    """``agentrl.agent``: one episode of the agent loop (defaults as upstream AgentRL)."""

    max_turns: StrictInt = Field(20, ge=1, description="assistant turns, then `task limit reached`")
    max_total_tokens: StrictInt = Field(8192, ge=1,
                                        description="prompt + response budget, then `agent context limit`")
    max_new_tokens: StrictInt = Field(1024, ge=1, description="tokens per turn")
    penalty: StrictFloat = Field(-0.2, description="reward of any episode that does not end `completed`")
    tool_format: StrictStr = Field("", description="verl tool-parser name (`hermes` for Qwen2.5)",
                                   json_schema_extra={"doc_default": "`rollout.multi_turn.format`"})


@dataclass(frozen=True, config=_STRICT)
class Endpoint:
    """A named OpenAI-compatible endpoint that serves turns at evaluation (``agentrl.cross_policy.endpoints[]``).

    Attributes:
        name: Pool member name (appears in metrics and in ``turn_policies``).
        base_url: Base URL of the server, e.g. ``http://127.0.0.1:8000/v1``.
        model: Model name sent in requests.
        weight: Relative probability of drawing this endpoint for a turn.
        api_key_env: Name of an environment variable holding the API key (none sent when empty).
    """

    name: StrictStr
    base_url: StrictStr
    model: StrictStr
    weight: StrictFloat = Field(1.0, ge=0.0)
    api_key_env: StrictStr = ""


@dataclass(frozen=True, config=_STRICT)
class CrossPolicyConfig:
    """``agentrl.cross_policy``: cross-policy sampling (defaults as upstream AgentRL; off by default)."""

    enable: StrictBool = Field(False, description="cross-policy sampling")
    stale_ratio: StrictFloat = Field(0.25, ge=0.0, le=1.0,
                                     description="probability that a turn goes to the stale pool (or fixed model)")
    stale_refresh_steps: StrictInt = Field(
        25, ge=1, description="K: the stale pool takes the actor's weights every K steps")
    sticky: StrictBool = Field(False, description="one draw per trajectory instead of per turn")
    seed: StrictInt = Field(0, description="router seed")
    stale_replicas: StrictInt = Field(1, ge=1, description="replicas of the stale pool (its resource share)")
    fixed_model_path: StrictStr = Field(
        "", description="local HF model directory served instead of the stale copy: loaded at start, never synced",
        json_schema_extra={"doc_default": "unset"})
    endpoints: tuple[Endpoint, ...] = Field(
        (), description="evaluation pool (`name`, `base_url`, `model`, `weight`, `api_key_env`)")

    def __post_init__(self) -> None:
        names = [e.name for e in self.endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"endpoint names must be unique, got {names}")

    def endpoint_pool(self) -> dict[str, float]:
        """Relative weights of the evaluation endpoints (empty when none are configured)."""
        return {e.name: e.weight for e in self.endpoints}


@dataclass(frozen=True, config=_STRICT)
class AsyncConfig:
    """``agentrl.async``: the asynchronous pipeline (``agentrl_async``); see :mod:`.staleness`."""

    max_staleness: StrictInt = Field(1, ge=0, description="most versions a trained turn may lag; 0 = synchronous")
    buffer_capacity: StrictInt | None = Field(
        None, ge=1, description="groups running plus finished-untrained",
        json_schema_extra={"doc_default": "(max_staleness + 1) x batch"})
    stale_policy: Annotated[StalePolicy, BeforeValidator(_lower)] = Field(
        StalePolicy.WAIT,
        description="`wait`, `drop` or `keep` (`keep` needs `algorithm.rollout_correction.rollout_is=token`)")
    max_inflight: StrictInt | None = Field(None, ge=1, description="most groups running at once")
    interrupt: StrictBool = Field(
        False, description="abort running generations at an update and resume them on the new weights")
    poll_interval: StrictFloat = Field(
        0.1, gt=0.0, description="seconds between looks of the admission pump and the sampler (`agentrl_sync`'s too)")
    max_failed_groups: StrictInt | None = Field(
        None, ge=1, description="groups that may fail (an episode raised) with no training batch between; then the "
        "run stops with an error instead of admitting more", json_schema_extra={"doc_default": "4 x batch"})

    def failure_limit(self, batch_groups: int) -> int:
        """Failed groups tolerated between two training batches (:attr:`max_failed_groups`, default 4 batches)."""
        return 4 * batch_groups if self.max_failed_groups is None else self.max_failed_groups

    def capacity(self, batch_groups: int) -> int:
        """The buffer capacity in groups for a training batch of ``batch_groups`` groups.

        Raises:
            ConfigError: the capacity cannot hold one batch, so the trainer could never start.
        """
        capacity = (self.max_staleness + 1) * batch_groups if self.buffer_capacity is None else self.buffer_capacity
        if capacity < batch_groups:
            raise ConfigError(
                f"{ROOT}.async.buffer_capacity={capacity} is smaller than one training batch "
                f"({batch_groups} groups, data.train_batch_size); raise it to at least {batch_groups}"
            )
        return capacity


@dataclass(frozen=True, config=_STRICT)
class AgentRLConfig:
    """The root ``agentrl`` config (key ``async`` is the attribute ``async_``, a Python keyword)."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    task_adv_norm: Annotated[TaskAdvNorm, BeforeValidator(TaskAdvNorm.parse)] = Field(
        TaskAdvNorm.TOKEN, description="`off`, `on`/`token` (statistics over loss tokens), `trajectory`")
    cross_policy: CrossPolicyConfig = Field(default_factory=CrossPolicyConfig)
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    start_model_wait_s: StrictFloat = Field(
        0.0, ge=0.0, description="seconds the trainer waits for the start model directory (`config.json` in "
        "`actor_rollout_ref.model.path`) to appear before it loads it, for a run launched while that model is still "
        "being written (the demo's warm-up and evaluation before RL, on a GPU); 0: no wait")


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


# ---- reading and validating -----------------------------------------------------------------------------------


def _plain(section: Any) -> Any:
    """A DictConfig (or anything with ``items``) as plain Python containers; ``???`` (OmegaConf missing) as None."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(section, DictConfig | ListConfig):
            section = OmegaConf.to_container(section, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl; plain mappings need nothing
        pass
    if isinstance(section, Mapping):
        return {str(k): _plain(v) for k, v in section.items()}
    if isinstance(section, list | tuple):
        return [_plain(v) for v in section]
    return None if section == "???" else section


def _dataclass_of(annotation: Any) -> type | None:
    """The pydantic dataclass inside an annotation (``X``, ``X | None``, ``tuple[X, ...]``), if any."""
    if isinstance(annotation, type) and hasattr(annotation, "__pydantic_fields__"):
        return annotation
    for arg in typing.get_args(annotation):
        found = _dataclass_of(arg)
        if found is not None:
            return found
    return None


def _keys(cls: type) -> dict[str, type | None]:
    """Config key -> nested section class (None for a leaf) of a section class."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for name, info in cls.__pydantic_fields__.items():
        out[info.alias or name] = _dataclass_of(hints[name])
    return out


def _section_at(root: type, path: tuple[str | int, ...]) -> type | None:
    cls: type | None = root
    for part in path:
        if isinstance(part, int) or cls is None:
            continue
        cls = _keys(cls).get(part)
    return cls


def _dotted(prefix: str, path: tuple[str | int, ...]) -> str:
    for part in path:
        prefix += f"[{part}]" if isinstance(part, int) else f".{part}"
    return prefix


def _validate(cls: type, data: Any, prefix: str) -> Any:
    """``cls`` validated from ``data``; a :class:`ConfigError` names each problem as a key under ``prefix``."""
    try:
        return _adapter(cls).validate_python(data)
    except _PydanticValidationError as error:
        problems = []
        for e in error.errors(include_url=False):
            loc = tuple(e["loc"])
            key = _dotted(prefix, loc)
            if e["type"] == "unexpected_keyword_argument":
                parent = _section_at(cls, loc[:-1])
                valid = sorted(_keys(parent)) if parent is not None else []
                nearest = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
                hint = (f"did you mean {_dotted(prefix, (*loc[:-1], nearest[0]))}?" if nearest
                        else f"valid keys: {', '.join(valid)}")
                problems.append(f"unknown key {key}: {hint}")
            elif e["type"] == "missing":
                problems.append(f"{key} is required")
            else:
                value = "" if isinstance(e["input"], Mapping) else f"={e['input']!r}"
                problems.append(f"{key}{value}: {e['msg'].removeprefix('Value error, ')}")
        raise ConfigError(f"invalid {prefix} config: {'; '.join(problems)}") from None


def load_agentrl(section: Mapping[str, Any] | Any | None) -> AgentRLConfig:
    """Validate an ``agentrl`` section (a DictConfig, a mapping, or None for all defaults).

    Raises:
        ConfigError: naming every unknown key (with the nearest valid one), wrong type or out-of-range value.
    """
    data = _plain(section) if section is not None else {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{ROOT} must be a mapping of sections, got {data!r}")
    return _validate(AgentRLConfig, data, ROOT)


def with_overrides(section: Any, overrides: Mapping[str, Any], prefix: str) -> Any:
    """A section (e.g. ``agentrl.agent``) with some keys replaced (e.g. an agent loop's keyword arguments), validated.

    Raises:
        ConfigError: naming the bad keys under ``prefix``.
    """
    if not overrides:
        return section
    current = _adapter(type(section)).dump_python(section, by_alias=True)
    return _validate(type(section), {**current, **_plain(dict(overrides))}, prefix)


def to_dict(config: AgentRLConfig) -> dict[str, Any]:
    """The tree as plain YAML-able values, with the config's key names (``async``)."""
    return _adapter(AgentRLConfig).dump_python(config, mode="json", by_alias=True)


_CACHE: dict[int, tuple[weakref.ref | None, AgentRLConfig]] = {}
_CACHE_LOCK = threading.Lock()


def agentrl_config(run_config: Any) -> AgentRLConfig:
    """The validated ``agentrl`` tree of a run config (verl's DictConfig or a mapping), read once per config object.

    Every component (agent loop, estimator, trainers, policy pool) reads its options from this one object.
    """
    key = id(run_config)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
        if cached is not None and cached[0] is not None and cached[0]() is run_config:
            return cached[1]
    config = load_agentrl(run_config.get(ROOT) if run_config is not None else None)
    try:
        ref = weakref.ref(run_config, lambda _, key=key: _CACHE.pop(key, None))
    except TypeError:  # a plain dict cannot be weakly referenced: not cached
        return config
    with _CACHE_LOCK:
        _CACHE[key] = (ref, config)
    return config


def _select(run_config: Any, dotted: str, default: Any = None) -> Any:
    node = run_config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) or hasattr(node, "get") else None
        if node is None:
            return default
    return node


def check_run(config: AgentRLConfig, run_config: Any) -> None:
    """Reject combinations of ``agentrl.*`` with verl's keys that cannot work (warnings for ones that do nothing).

    Raises:
        ConfigError: naming the keys involved and what to set.
    """
    problems = []
    correction = _select(run_config, "algorithm.rollout_correction") or {}
    trainer_mode = _select(run_config, "trainer.v1.trainer_mode")
    if config.async_.stale_policy is StalePolicy.KEEP and not correction.get("rollout_is"):
        problems.append(
            f"{ROOT}.async.stale_policy=keep trains groups beyond the staleness bound and needs verl's off-policy "
            "correction against the behaviour log-probs: set algorithm.rollout_correction.rollout_is=token "
            "(truncated importance weights), or use stale_policy=wait or drop")
    if trainer_mode == ASYNC_TRAINER_MODE:
        batch = _select(run_config, "data.train_batch_size")
        if batch is not None:
            try:
                config.async_.capacity(int(batch))
            except ConfigError as error:
                problems.append(str(error))
    cp = config.cross_policy
    if cp.enable and cp.endpoints:
        problems.append(f"{ROOT}.cross_policy.endpoints is for evaluation (agentrl-verl evaluate); the training pool "
                        "is always the current policy plus the stale pool or the fixed model: remove the endpoints")
    if cp.enable and cp.fixed_model_path:
        model = _select(run_config, "actor_rollout_ref.model") or {}
        problems.extend(_fixed_model_problems(cp.fixed_model_path, model.get("tokenizer_path") or model.get("path"),
                                              bool(model.get("trust_remote_code", False))))
    engine = _select(run_config, "actor_rollout_ref.rollout.checkpoint_engine.backend", "naive")
    if cp.enable and not cp.fixed_model_path and engine == "naive":
        problems.append(
            f"{ROOT}.cross_policy.enable=true runs the stale pool as standalone replicas, which the 'naive' "
            "checkpoint engine cannot reach: set actor_rollout_ref.rollout.checkpoint_engine.backend=nccl on GPUs "
            "or =ray_object_store on CPU")
    agent_loop = _select(run_config, "actor_rollout_ref.rollout.agent.default_agent_loop")
    if _select(run_config, "reward.num_workers") == 0 and agent_loop != AGENT_NAME:
        # verl's agent loop hands an episode without a reward to a random reward worker: with none, it fails there.
        problems.append(f"reward.num_workers=0 starts no reward worker, which only {AGENT_NAME} episodes do without "
                        f"(the environment scores them): set actor_rollout_ref.rollout.agent.default_agent_loop="
                        f"{AGENT_NAME}, or reward.num_workers to 1 or more")
    if agent_loop == AGENT_NAME and not config.env.url and config.env.launch != "ray":
        problems.append(f"{AGENT_NAME} needs the controller address: set +{ROOT}.env.url=http://HOST:PORT")
    if config.env.launch == "ray" and config.env.url:
        problems.append(f"{ROOT}.env.launch=ray gives the agent loop the URL of the stack it starts: remove "
                        f"{ROOT}.env.url")
    if config.env.token_file:
        try:
            config.env.resolved_token()
        except ValueError as error:
            problems.append(f"{ROOT}.env.token_file: {error}")
    problems.extend(_engine_problems(config, _select(run_config, "actor_rollout_ref.rollout.name"), trainer_mode))
    if problems:
        raise ConfigError("contradictory config: " + "; ".join(problems))
    estimator = _select(run_config, "algorithm.adv_estimator")
    if estimator is not None and estimator != ESTIMATOR_NAME and config.task_adv_norm is not TaskAdvNorm.OFF:
        logger.warning("%s.task_adv_norm=%s has no effect with algorithm.adv_estimator=%s (use %s)",
                       ROOT, config.task_adv_norm.value, estimator, ESTIMATOR_NAME)
    if cp.fixed_model_path and not cp.enable:
        logger.warning("%s.cross_policy.fixed_model_path has no effect with %s.cross_policy.enable=false",
                       ROOT, ROOT)
    if cp.enable and not correction.get("bypass_mode", False) and not correction.get("rollout_is"):
        # Decoupled mode recomputes old_log_probs with the actor: the PPO ratio then ignores that stale turns came
        # from another policy unless importance weights against rollout_log_probs correct for it.
        logger.warning(
            "cross-policy sampling without behaviour-policy correction: set "
            "algorithm.rollout_correction.bypass_mode=true (ratio against each token's behaviour log-prob, "
            "as upstream AgentRL) or algorithm.rollout_correction.rollout_is=token")


def _fixed_model_problems(path: str, actor_tokenizer: str | None, trust_remote_code: bool) -> list[str]:
    """Why the fixed pool model at ``path`` cannot serve the actor's episodes (empty when it can).

    The pool exchanges token ids, so the model's tokenizer must map tokens to ids exactly as the actor's does, and
    its embedding must cover them.
    """
    key = f"{ROOT}.cross_policy.fixed_model_path={path}"
    config_file = Path(path).expanduser() / "config.json"
    if not config_file.is_file():
        return [f"{key} is not a Hugging Face model directory (no config.json): give a local directory written by "
                "save_pretrained (config, weights and the actor's tokenizer)"]
    from transformers import AutoTokenizer

    try:
        vocab = AutoTokenizer.from_pretrained(config_file.parent, trust_remote_code=trust_remote_code).get_vocab()
    except (OSError, ValueError) as error:
        return [f"{key} has no loadable tokenizer ({error}): save the actor's tokenizer there (save_pretrained)"]
    problems = []
    if actor_tokenizer is not None:
        actor_vocab = AutoTokenizer.from_pretrained(
            Path(actor_tokenizer).expanduser(), trust_remote_code=trust_remote_code).get_vocab()
        if vocab != actor_vocab:
            problems.append(f"{key} has another tokenizer than the actor ({len(vocab)} tokens, the actor's "
                            f"{len(actor_vocab)}, or other ids): the pool exchanges token ids, so give a model that "
                            "uses the actor's tokenizer")
    embedding = json.loads(config_file.read_text()).get("vocab_size")
    if embedding is not None and embedding < len(vocab):
        problems.append(f"{key} has vocab_size {embedding} in config.json, fewer than its tokenizer's {len(vocab)} "
                        "tokens")
    return problems


PAUSING_ENGINES = ("hf", "vllm")
"""Rollout engines whose servers can pause without aborting (``agentrl_async`` with ``interrupt: false``): ``hf``
has its own pause, verl's vLLM server gets one from :mod:`agentrl_verl.backends.vllm_server`."""


def _engine_problems(config: AgentRLConfig, engine: str | None, trainer_mode: str | None) -> list[str]:
    """Why the rollout ``engine`` cannot run ``trainer_mode`` with the ``agentrl.async`` settings (empty: it can).

    Every engine runs ``agentrl_sync`` and ``agentrl_async`` with ``interrupt: true`` (verl's abort API). With
    ``interrupt: false`` the trainer pauses every server before a weight update, which only the
    :data:`PAUSING_ENGINES` can: verl 0.9.1's SGLang server has no ``pause_generation``, and the run would fail at
    its first weight update.
    """
    if trainer_mode != ASYNC_TRAINER_MODE or engine is None or config.async_.interrupt or engine in PAUSING_ENGINES:
        return []
    return [f"trainer.v1.trainer_mode={ASYNC_TRAINER_MODE} with {ROOT}.async.interrupt=false pauses every rollout "
            f"server before a weight update, which actor_rollout_ref.rollout.name={engine} cannot do (verl's "
            f"{engine} server has no pause_generation): set +{ROOT}.async.interrupt=true (running generations are "
            f"aborted and resumed on the new weights), or use rollout.name={' or '.join(PAUSING_ENGINES)}"]


def validate_run_config(run_config: Any) -> AgentRLConfig:
    """Validate the ``agentrl`` tree of verl's run config on the driver and write the complete tree back.

    Called before any worker starts; the workers then receive the validated tree with every default filled in.

    Raises:
        ConfigError: see :func:`load_agentrl` and :func:`check_run`.
    """
    config = load_agentrl(run_config.get(ROOT))
    check_run(config, run_config)
    from omegaconf import DictConfig, OmegaConf, open_dict

    if isinstance(run_config, DictConfig):
        with open_dict(run_config):
            run_config[ROOT] = OmegaConf.create(to_dict(config))
    return agentrl_config(run_config)


# ---- documentation --------------------------------------------------------------------------------------------


def _doc_default(info: Any) -> str:
    extra = info.json_schema_extra or {}
    if "doc_default" in extra:
        return extra["doc_default"]
    value = info.default_factory() if info.default_factory is not None else info.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, tuple):
        return f"`{list(value)}`"
    if isinstance(value, str):
        return f"`{value}`"
    return str(value)


def config_rows(cls: type = AgentRLConfig, prefix: str = ROOT) -> list[tuple[str, str, str]]:
    """``(key, default, meaning)`` of every documented leaf key, in declaration order."""
    rows = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for name, info in cls.__pydantic_fields__.items():
        key = f"{prefix}.{info.alias or name}"
        nested = _dataclass_of(hints[name])
        if nested is not None and typing.get_origin(hints[name]) is not tuple:
            rows.extend(config_rows(nested, key))
        else:
            rows.append((key, _doc_default(info), info.description or ""))
    return rows


def config_table() -> str:
    """The markdown rows (``docs/config.md``) of the ``agentrl.*`` keys (header excluded)."""
    return "\n".join(f"| `{key}` | {default} | {meaning} |" for key, default, meaning in config_rows())
