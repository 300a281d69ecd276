"""A ``cpu`` platform for verl 0.9.1, so that the real trainer (FSDP2 engines, Ray, TransferQueue) runs without GPUs.

verl resolves its device through :mod:`verl.plugin.platform`: every registered platform is probed in registration
order and, when none answers, verl falls back to ``nvidia``. This module registers :class:`PlatformCPU` last, so
on any machine with an accelerator the vendor platform still wins; the CPU platform is chosen only where no
accelerator exists, or explicitly with ``AGENTRL_PLATFORM=cpu`` (or verl's own ``VERL_PLATFORM=cpu``).

A few verl code paths assume an accelerator even behind the platform abstraction. Where the CPU platform is
active, :func:`register` works around each of them narrowly at run time (no verl file is edited); every
workaround names the verl code it targets, and ``tests/agentrl_verl/backends/test_platform_cpu.py`` fails loudly when an
assumption stops holding in a new verl release:

* ``verl.utils.distributed`` builds the backend ``"cpu:gloo,{device}:{backend}"``, i.e. ``"cpu:gloo,cpu:gloo"``,
  which torch rejects ("Duplicate device type cpu"); and every rank meets through a TCP store on a port picked
  free seconds earlier, which another connection on the host may take by then. One-rank groups meet through a file.
* ``verl.workers.engine`` registers the FSDP engines for ``cuda`` and ``npu`` only.
* ``verl.workers.engine.fsdp.transformer_impl`` gives forward-only (reference) engines
  ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an accelerator.
* ``verl.utils.model.load_valuehead_model`` (the critic) hard-codes ``attn_implementation="flash_attention_2"``.

Ray: verl's placement bundles ask for one ``GPU`` per rank and its resource check counts only GPU/NPU, so the
platform reports its Ray resource as ``GPU``; start Ray with a logical ``num_gpus`` (the ``cpu_tiny`` preset sets
``ray_kwargs.ray_init.num_gpus``) and at least ``3 * ranks + 2`` logical CPUs.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import shutil
import sys
import tempfile
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import wrapt
from verl.plugin.platform import PlatformBase, PlatformRegistry, get_platform

from agentrl_verl.core.verl_seam import engine_registry

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"
ENV_SELECT = "AGENTRL_PLATFORM"
# Engine backends whose implementation is device-agnostic (they go through the platform) and may run on CPU.
CPU_ENGINE_BACKENDS = ("fsdp", "fsdp2")


def _host_memory() -> tuple[int, int]:
    """(available, total) host memory in bytes."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


class _CPUDeviceModule(types.ModuleType):
    """Stands in for ``torch.cuda`` where verl calls ``get_torch_device().<fn>()``.

    ``is_available()`` is False on purpose: verl uses it to guard accelerator memory bookkeeping (peak stats,
    memory fractions), which has no meaning on the host. Cache and stream calls are no-ops; RNG calls go to the
    CPU generator; anything else falls through to :mod:`torch.cpu`.
    """

    def __init__(self) -> None:
        super().__init__("agentrl_verl.backends.platform_cpu.device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return _host_memory()

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    reset_accumulated_memory_stats = reset_peak_memory_stats

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


_DEVICE_MODULE = _CPUDeviceModule()


def accelerator_present() -> bool:
    """Whether this host has an accelerator that a vendor platform would use (CUDA/ROCm, Ascend, nvidia-smi)."""
    if torch.cuda.is_available() or getattr(torch, "npu", None) is not None:
        return True
    # CPU-only Ray actors on a GPU host see no CUDA device but still must not pick the CPU platform.
    return any(shutil.which(cmd) for cmd in ("nvidia-smi", "rocm-smi", "npu-smi"))


def cpu_platform_requested() -> bool:
    """Whether the CPU platform was asked for explicitly (``AGENTRL_PLATFORM=cpu`` or ``VERL_PLATFORM=cpu``)."""
    chosen = (os.environ.get(ENV_SELECT, ""), os.environ.get("VERL_PLATFORM", ""))
    return PLATFORM_NAME in (value.strip().lower() for value in chosen)


class PlatformCPU(PlatformBase):
    """verl platform for hosts without an accelerator: gloo collectives, host memory, CPU RNG."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return cpu_platform_requested() or not accelerator_present()

    def current_device(self) -> torch.device:  # type: ignore[override]
        # verl calls ``tensor.to(get_device_id())``; an integer would mean ``cuda:<index>``.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding a (logical) GPU; the value is meaningless to CPU torch but harmless.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl's placement bundles ask for one accelerator per rank and ResourcePoolManager counts only GPU/NPU.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# ---------------------------------------------------------------------------------------------------------------
# Workarounds, applied only where the CPU platform is active.
# ---------------------------------------------------------------------------------------------------------------


def _gloo_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap verl.utils.distributed.initialize_global_process_group_ray to default to ``cpu:gloo``.

    A group of one rank meets through a file rather than verl's TCP store: verl picks ``MASTER_PORT`` by binding
    port 0 in one process and the rank binds it again seconds later; in between any connection on the host may
    take that port (``EADDRINUSE``). A file rendezvous opens no port. An explicit ``DIST_INIT_METHOD`` is kept.
    """

    @functools.wraps(fn)
    def wrapper(timeout_second: int | None = None, backend: str | None = None) -> Any:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 or os.environ.get("DIST_INIT_METHOD"):
            return fn(timeout_second=timeout_second, backend=backend or "cpu:gloo")
        fd, store = tempfile.mkstemp(prefix="agentrl-pg-")  # torch's FileStore takes an empty file
        os.close(fd)
        os.environ["DIST_INIT_METHOD"] = f"file://{store}"
        try:
            return fn(timeout_second=timeout_second, backend=backend or "cpu:gloo")
        finally:
            del os.environ["DIST_INIT_METHOD"]  # read once by verl; not for this process's children

    wrapper.__agentrl_cpu__ = True  # type: ignore[attr-defined]
    return wrapper


def _patch_distributed_backend() -> None:
    # verl.utils.distributed.initialize_global_process_group_ray builds "cpu:gloo,{device}:{backend}" which on
    # CPU is "cpu:gloo,cpu:gloo" (torch: "Duplicate device type cpu"). engine_workers imports the function by
    # name, so the module attribute is replaced before that import and, if it already happened, there too.
    import verl.utils.distributed as dist

    if getattr(dist.initialize_global_process_group_ray, "__agentrl_cpu__", False):
        return
    dist.initialize_global_process_group_ray = _gloo_only(dist.initialize_global_process_group_ray)
    engine_workers = sys.modules.get("verl.workers.engine_workers")
    if engine_workers is not None:
        engine_workers.initialize_global_process_group_ray = dist.initialize_global_process_group_ray


OPTIONAL_ENGINES_WARNING = r"(torchtitan|veomni|automodel|mindspeed|megatron) engine is not available"
"""verl.workers.engine warns once per optional GPU engine it cannot import; none of them runs on CPU."""


def _register_cpu_engines() -> None:
    # verl.workers.engine.fsdp registers FSDPEngineWithLMHead / FSDPEngineWithValueHead for ("cuda", "npu") only;
    # they reach the device through the platform, so the same classes serve the "cpu" key.
    registry = engine_registry()
    for backends in registry.values():
        for backend in CPU_ENGINE_BACKENDS:
            registry = backends.get(backend, {})
            if "cuda" in registry:
                registry.setdefault(PLATFORM_NAME, registry["cuda"])


def _patch_offload_policy() -> None:
    # verl.workers.engine.fsdp.transformer_impl.FSDPEngine._build_fsdp_module gives forward-only engines (the
    # reference policy) CPUOffloadPolicy(pin_memory=True); pinned memory needs an accelerator. A subclass keeps
    # every isinstance check of FSDP2 true.
    from verl.workers.engine.fsdp import transformer_impl

    policy_cls = transformer_impl.CPUOffloadPolicy
    if getattr(policy_cls, "__agentrl_cpu__", False):
        return

    class UnpinnedCPUOffloadPolicy(policy_cls):
        """``CPUOffloadPolicy`` that never pins host memory."""

        __agentrl_cpu__ = True

        def __init__(self, pin_memory: bool = True, **kwargs: Any) -> None:
            super().__init__(pin_memory=False, **kwargs)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


# Set while verl's critic loader runs in this thread or task: its flash_attention_2 request then means sdpa.
_FLASH_TO_SDPA: contextvars.ContextVar[bool] = contextvars.ContextVar("agentrl_flash_to_sdpa", default=False)


def _sdpa_valuehead_loader(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def load(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool) -> Any:
        token = _FLASH_TO_SDPA.set(True)
        try:
            return fn(local_path, torch_dtype, model_config, trust_remote_code)
        finally:
            _FLASH_TO_SDPA.reset(token)

    load.__agentrl_cpu__ = True  # type: ignore[attr-defined]
    return load


def _patch_valuehead_attention() -> None:
    # verl.utils.model.load_valuehead_model hard-codes flash_attention_2 for the critic (the FSDP engine imports it
    # at call time, so replacing the module attribute is enough). transformers' attention check is wrapped once,
    # for good, and changes the answer only inside that loader's call in the same thread or task: concurrent loads
    # elsewhere in the process are untouched.
    import verl.utils.model as model_utils
    from transformers import PreTrainedModel

    check = PreTrainedModel._check_and_adjust_attn_implementation
    if not getattr(check, "__agentrl_cpu__", False):

        @functools.wraps(check)
        def check_on_cpu(self: Any, attn_implementation: str | None, *args: Any, **kwargs: Any) -> Any:
            if attn_implementation == "flash_attention_2" and _FLASH_TO_SDPA.get():
                attn_implementation = "sdpa"
            return check(self, attn_implementation, *args, **kwargs)

        check_on_cpu.__agentrl_cpu__ = True  # type: ignore[attr-defined]
        PreTrainedModel._check_and_adjust_attn_implementation = check_on_cpu
    if not getattr(model_utils.load_valuehead_model, "__agentrl_cpu__", False):
        model_utils.load_valuehead_model = _sdpa_valuehead_loader(model_utils.load_valuehead_model)


ENGINE_PACKAGE = "verl.workers.engine"
"""Importing it costs 3.5 s (the FSDP engine brings ``peft`` and ``datasets``); only the processes that build an
engine need it, so its workarounds wait for its first import instead of importing it in every Ray worker."""


def _patch_engines(_module: types.ModuleType | None = None) -> None:
    _register_cpu_engines()
    _patch_offload_policy()


def apply_cpu_workarounds() -> None:
    """Apply every CPU workaround (idempotent). Called by :func:`register` when the CPU platform is active; the
    engines' follow the first import of :data:`ENGINE_PACKAGE` (at once where it is already imported)."""
    _patch_distributed_backend()
    _patch_valuehead_attention()
    # verl.workers.engine warns once per optional GPU engine it cannot import; none of them runs on CPU.
    warnings.filterwarnings("ignore", message=OPTIONAL_ENGINES_WARNING, category=UserWarning)
    wrapt.register_post_import_hook(_patch_engines, ENGINE_PACKAGE)


def register() -> None:
    """Register :class:`PlatformCPU` with verl and, where it is the active platform, apply the CPU workarounds."""
    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    if os.environ.get(ENV_SELECT, "").strip().lower() == PLATFORM_NAME:
        # Explicit choice: also tell verl, whose detection would otherwise probe the vendor platforms first.
        os.environ.setdefault("VERL_PLATFORM", PLATFORM_NAME)
    if get_platform().device_name == PLATFORM_NAME:
        apply_cpu_workarounds()
