"""The seam to verl's internals: every private verl 0.9.1 member agentrl_verl relies on, in one place.

verl has no public API for some of what a plugin must do (fill a private registry, hook a V1 trainer's steps, read
its replay buffer's state, work around accelerator assumptions on CPU). :data:`PRIVATE` lists each such member with
what we do with it, where, and the parameters we rely on; :func:`check` compares one entry with the installed verl
and ``tests/agentrl_verl/core/test_verl_seam.py`` runs it for all (``tests/agentrl_verl/backends/test_vllm_cpu.py``
for those of verl's vLLM modules, in the vLLM environment), so a verl release that moves one of them fails with a
message naming the member and the module to update instead of breaking a run. Private module-level objects are
reached only through the accessors below; the per-sample fields of a batch only through :func:`batch_fields`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERL_VERSION = "0.9.1"


@dataclass(frozen=True)
class Private:
    """One private verl (or transformers) member we use.

    Attributes:
        path: ``module:Qualified.name``.
        use: ``override`` (a subclass replaces it and calls it), ``call``, ``read`` (instance state set in the
            owner's ``__init__``), ``register`` (we add entries) or ``wrap`` (replaced at run time).
        where: Our module that relies on it.
        params: Parameter names a callable must take, in order (None: not a callable, or not checked).
        set_in: For ``read``: the owner's method that sets the instance attribute.
    """

    path: str
    use: str
    where: str
    params: tuple[str, ...] | None = None
    set_in: str = "__init__"


_TRAINER = "verl.trainer.ppo.v1.trainer_base:PPOTrainer"
_BUFFER = "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer"
_SYNC, _ASYNC, _POOL = "core.trainer", "core.async_trainer", "core.policy_pool"
_CPU, _HF, _VLLM = "backends.platform_cpu", "backends.hf_rollout", "backends.vllm_cpu"
_VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer"
VLLM_MODULES = ("verl.workers.rollout.vllm_rollout",)
"""verl modules that import vLLM: their entries are checked in the vLLM environment (``needs_vllm``)."""
WEIGHT_TRANSFER = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
"""verl's bucketed weight transfer over ZMQ (CUDA IPC or shared memory): needs no vLLM, but its package imports it,
so it is loaded from its file (:func:`bucketed_weight_transfer`)."""

PRIVATE: tuple[Private, ...] = (
    # V1 trainer hooks that have no public counterpart.
    Private(f"{_TRAINER}._compute_advantage", "override", _SYNC, ("self", "batch", "metrics")),
    Private(f"{_TRAINER}._compute_metrics", "override", f"{_SYNC}, {_ASYNC}, {_POOL}",
            ("self", "batch", "metrics", "timing_raw", "global_steps", "epoch")),
    Private(f"{_TRAINER}._setup", "override", f"{_SYNC}, {_POOL}", ("self",)),
    # Skipping the update of a batch without a loss token (SkipEmptyBatchMixin).
    Private(f"{_TRAINER}._step_once", "override", _SYNC, ("self", "metrics", "timing_raw", "sample_batch_size")),
    Private(f"{_TRAINER}._balance_batch", "override", _SYNC, ("self", "batch", "metrics", "logging_prefix",
                                                            "keep_minibatch")),
    Private(f"{_TRAINER}._build_replay_buffer", "override", _ASYNC, ("self",)),
    Private(f"{_TRAINER}._save_checkpoint", "override", _ASYNC, ("self",)),
    Private(f"{_TRAINER}._next_train_batch", "call", _ASYNC, ("self", "num_prompts")),
    Private(f"{_TRAINER}._submit_batch_to_rollout", "call", _ASYNC, ("self", "batch")),
    # The async replay buffer's state and its internal steps (StalenessReplayBuffer.sample).
    Private(f"{_BUFFER}._sync_metadata_from_transfer_queue", "call", _ASYNC, ("self",)),
    Private(f"{_BUFFER}._clear_groups", "call", _ASYNC, ("self", "partition_id", "uids")),
    Private(f"{_BUFFER}._materialize_batch", "call", _ASYNC,
            ("self", "partition_id", "selected_prompt_uids", "partition_snapshot")),
    *(Private(f"{_BUFFER}.{name}", "read", _ASYNC) for name in (
        "partitions", "pending_keys", "running_keys", "finished_keys", "failure_keys", "prompt_global_steps")),
    # A second group of named rollout replicas (the stale pool).
    Private("verl.workers.rollout.llm_server:LLMServerManager.rollout_replica_class", "read", _POOL),
    Private("verl.workers.rollout.replica:RolloutReplica.__init__", "call", _POOL,
            ("self", "replica_rank", "config", "model_config", "gpus_per_node", "is_reward_model",
             "is_teacher_model", "name_suffix")),
    # Its launch beside verl's setup, once the actor's resource pool is placed.
    *(Private(f"{_TRAINER}.{name}", "read", _POOL, set_in="_init_resource_pool_mgr")
      for name in ("resource_pool_manager", "mapping")),
    Private("verl.single_controller.ray.base:RayResourcePool.pgs", "read", _POOL),
    # The admission gate of verl's vLLM server, which the pause the plugin adds to it closes.
    *(Private(f"{_VLLM_SERVER}.{name}", "read", _VLLM) for name in (
        "_submission_paused", "_rejecting", "_resume_event", "_admitting")),
    # The hf backend's weight updates through verl's bucketed transfer; its sockets get a timeout.
    Private(f"{WEIGHT_TRANSFER}:BucketedWeightSender.__init__", "call", _HF,
            ("self", "zmq_handle", "bucket_size_mb", "use_shm")),
    Private(f"{WEIGHT_TRANSFER}:BucketedWeightSender._init_socket", "override", _HF, ("self",)),
    Private(f"{WEIGHT_TRANSFER}:BucketedWeightReceiver.__init__", "call", _HF,
            ("self", "zmq_handle", "device", "use_shm")),
    # Registries without a public registration function.
    Private("verl.workers.rollout.base:_ROLLOUT_REGISTRY", "register", _HF),
    Private("verl.workers.engine:EngineRegistry._engines", "register", _CPU),
    # verl's row-by-row log-probs where flash-attn is missing, replaced by chunks of rows (called by module global).
    Private("verl.utils.torch_functional:logprobs_from_logits_v2", "wrap", "backends.chunked_logprobs",
            ("logits", "labels")),
    # Accelerator assumptions worked around on the CPU platform.
    Private("verl.utils.distributed:initialize_global_process_group_ray", "wrap", _CPU,
            ("timeout_second", "backend")),
    Private("verl.workers.engine.fsdp.transformer_impl:CPUOffloadPolicy", "wrap", _CPU),
    Private("verl.utils.model:load_valuehead_model", "wrap", _CPU,
            ("local_path", "torch_dtype", "model_config", "trust_remote_code")),
    Private("transformers:PreTrainedModel._check_and_adjust_attn_implementation", "wrap", _CPU,
            ("self", "attn_implementation")),
)


class VerlChanged(RuntimeError):
    """The installed verl no longer has a private member agentrl_verl relies on, in the shape it relies on."""


def resolve(path: str) -> Any:
    """The object at ``module:Qualified.name``.

    Raises:
        VerlChanged: the module or an attribute on the way is missing.
    """
    module_name, _, qualname = path.partition(":")
    try:
        obj = bucketed_weight_transfer() if module_name == WEIGHT_TRANSFER else importlib.import_module(module_name)
    except ImportError as error:
        raise VerlChanged(f"{path}: module {module_name} cannot be imported ({error})") from None
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise VerlChanged(f"{path}: {part!r} is gone")
        obj = getattr(obj, part)
    return obj


def _instance_attribute_set(path: str, set_in: str) -> None:
    owner_path, _, name = path.rpartition(".")
    source = inspect.getsource(getattr(resolve(owner_path), set_in))
    if f"self.{name} =" not in source and f"self.{name}:" not in source:
        raise VerlChanged(f"{path}: {owner_path}.{set_in} no longer sets self.{name}")


def check(entry: Private) -> None:
    """Compare one entry with the installed verl.

    Raises:
        VerlChanged: naming the member, what changed, and where agentrl_verl uses it.
    """
    try:
        if entry.use == "read" and "." in entry.path.partition(":")[2]:
            owner = resolve(entry.path.rpartition(".")[0])
            if not hasattr(owner, entry.path.rpartition(".")[2]):
                _instance_attribute_set(entry.path, entry.set_in)
            return
        obj = resolve(entry.path)
        if entry.params is not None:
            names = tuple(inspect.signature(obj).parameters)
            if names[: len(entry.params)] != entry.params:
                raise VerlChanged(f"{entry.path}: parameters are {names}, agentrl_verl expects {entry.params}")
    except VerlChanged as error:
        raise VerlChanged(f"verl {VERL_VERSION} internals changed: {error}; update agentrl_verl.{entry.where} "
                          f"and agentrl_verl.core.verl_seam") from None


def needs_vllm(entry: Private) -> bool:
    """Whether checking ``entry`` imports vLLM (``tests/agentrl_verl/backends/test_vllm_cpu.py`` checks those)."""
    return entry.path.startswith(VLLM_MODULES) and not entry.path.startswith(WEIGHT_TRANSFER)


# ---- accessors of private module-level objects ----------------------------------------------------------------


def rollout_adapter_registry() -> dict[tuple[str, str], str]:
    """verl's ``(rollout name, mode) -> server adapter class path`` registry (trainer and checkpoint workers)."""
    return resolve("verl.workers.rollout.base:_ROLLOUT_REGISTRY")


def bucketed_weight_transfer() -> types.ModuleType:
    """verl's :data:`WEIGHT_TRANSFER` module, loaded from its file without the vLLM package that holds it."""
    if WEIGHT_TRANSFER not in sys.modules:
        import verl.workers.rollout as rollout

        path = Path(rollout.__file__).parent / "vllm_rollout" / "bucketed_weight_transfer.py"
        spec = importlib.util.spec_from_file_location(WEIGHT_TRANSFER, path)
        if spec is None or not path.is_file():
            raise ImportError(f"no {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[WEIGHT_TRANSFER] = module  # the package, if imported later (vLLM installed), finds it loaded
    return sys.modules[WEIGHT_TRANSFER]


def engine_registry() -> dict[str, dict[str, dict[str, type]]]:
    """verl's ``model type -> backend -> device -> engine class`` registry."""
    return resolve("verl.workers.engine:EngineRegistry._engines")


# ---- per-sample fields of a training batch --------------------------------------------------------------------


def batch_fields(batch: Any, *fields: str, padding: bool = False) -> dict[str, list[Any]]:
    """Per-sample ``fields`` of a TransferQueue batch, in batch order; padding rows only with ``padding=True``.

    TransferQueue returns a non-tensor field as a ``NonTensorStack``, a numpy array or a list depending on its
    backend, and a dict inside it may come wrapped (``.data``); tensors (e.g. ``rm_scores``) come as one tensor, dense
    or nested (jagged).
    Every value here is a plain Python object, one per row.
    """
    import torch
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(fields))
    rows = [i for i, tag in enumerate(batch.tags) if padding or not tag.get("is_padding", False)]
    out = {}
    for name in fields:
        values: Sequence[Any] = data[name]
        if isinstance(values, torch.Tensor):  # also a jagged NestedTensor (e.g. rm_scores), whose tolist() fails
            values = [row.tolist() for row in values.unbind(0)]
        else:
            values = values.tolist() if hasattr(values, "tolist") else list(values)
        out[name] = [_unwrap(values[i]) for i in rows]
    return out


def _unwrap(value: Any) -> Any:
    return value.data if hasattr(value, "data") and not hasattr(value, "shape") else value
