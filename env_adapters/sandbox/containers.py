"""Containers for sessions: isolation limits, ownership labels, a pool of pre-started containers, a reaper.

Every container this module starts carries the label ``agentrl.sandbox`` and the label ``agentrl.owner``
naming the process that owns it as ``host:pid:start-time`` (start time from ``/proc``, so a reused pid does
not count as the same owner). The owner keeps the set of its live containers (sessions and pool) in memory.
The reaper removes a labelled container when

- this process owns it and it is neither in a session nor in the pool (a session that ended without
  cleaning up), or
- another process on this host owns it and that process no longer exists (a crashed or killed worker:
  its restart, or any other worker on the host, cleans up after it).

Containers of owners on other hosts are left alone: their liveness cannot be checked from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Ulimit
from docker.utils import parse_bytes

logger = logging.getLogger(__name__)

LABEL_SANDBOX = "agentrl.sandbox"
LABEL_OWNER = "agentrl.owner"
LABEL_IMAGE = "agentrl.image"


@dataclass(frozen=True)
class Limits:
    """Isolation of one container (Docker's own units).

    Attributes:
        network: Docker network mode; ``none`` leaves only loopback.
        memory: Memory limit (swap included), e.g. ``512m``.
        cpus: CPU quota in cores.
        pids: Maximum number of processes (stops fork bombs).
        disk: Writable space (Docker units, ``None``: unbounded): what the container may write on top of its
            image, anywhere in its file system. Bounded by the daemon (``--storage-opt size``) where its storage
            can: overlay2 on xfs with project quotas, or btrfs with simple quotas (``scripts/setup.sh`` starts
            such a daemon; with btrfs's full quotas the image counts too); a write past it then fails ("Disk
            quota exceeded" on btrfs, "No space left on device" on xfs). Elsewhere (overlay2 on ext4)
            :class:`ContainerPool` warns once and falls back to a size limit of any one file (``RLIMIT_FSIZE``)
            and a check of the whole writable layer after the fact (:meth:`ContainerPool.over_disk_limit`).
        nofile: Open-file limit (soft and hard) of every process; ``None``: the Docker daemon's own limit. Upstream
            ran under Docker's classic ``LimitNOFILE=infinity`` (1048576); a daemon without CAP_SYS_RESOURCE
            cannot raise its containers above its own hard limit, so the default leaves it alone.
    """

    network: str = "none"
    memory: str = "512m"
    cpus: float = 1.0
    pids: int = 256
    disk: str | None = "2g"
    nofile: int | None = None

    @property
    def disk_bytes(self) -> int | None:
        return None if self.disk is None else parse_bytes(self.disk)


def _start_time(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def this_owner() -> str:
    """The owner label of this process."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_alive(owner: str) -> bool | None:
    """Whether the process named by an owner label still runs; None when it lives on another host."""
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname():
        return None
    if not pid.isdigit():
        return False  # a malformed label: nobody can claim it
    return _start_time(int(pid)) == start


def remove_containers(client: docker.DockerClient, names: Iterable[str]) -> list[str]:
    """Remove containers by name, all at once (on btrfs one removal walks the container's whole tree, seconds each:
    one after another, a worker's pool outlived its stop's grace period). A container already gone, or being
    removed by another reaper, counts as removed. Returns the names."""
    names = list(names)

    def remove(name: str) -> None:
        try:
            client.api.remove_container(name, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: "removal already in progress" elsewhere
                raise

    if len(names) == 1:
        remove(names[0])
    elif names:
        with ThreadPoolExecutor(max_workers=min(len(names), 16), thread_name_prefix="container-removal") as pool:
            list(pool.map(remove, names))
    return names


def remove_orphans(client: docker.DockerClient | None = None) -> list[str]:
    """Remove the sandbox containers whose owner on this host no longer runs (e.g. a worker killed before its pool
    was removed): what any pool's reaper would remove, for callers without a pool (``agentrl-env up`` after it
    had to kill a worker). Returns the names."""
    own_client = client is None
    client = client or docker.from_env()
    try:
        return remove_containers(client, [name for name, owner in _sandbox_containers(client)
                                          if owner_alive(owner) is False])
    finally:
        if own_client:
            client.close()


def _sandbox_containers(client: docker.DockerClient) -> list[tuple[str, str]]:
    """(name, owner label) of every container this module started on the daemon, running or not."""
    # The low-level listing: no per-container inspect that could race with removals elsewhere.
    return [(info["Names"][0].lstrip("/"), (info.get("Labels") or {}).get(LABEL_OWNER, ""))
            for info in client.api.containers(all=True, filters={"label": LABEL_SANDBOX})]


@dataclass(frozen=True)
class Lease:
    """A container handed out by :meth:`ContainerPool.acquire`.

    Attributes:
        container: The running container.
        ready: What the pool's ``prepare`` hook made ready in it (e.g. an open shell); None without a hook.
    """

    container: Container
    ready: Any = None


DOCKER_RESOURCE = "docker"
"""The Ray custom resource of nodes whose Docker daemon answers: the stack places `os` replicas by it."""


def docker_available() -> bool:
    """Whether a Docker daemon answers (the ``os`` task needs one)."""
    try:
        client = docker.from_env()
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no socket, no permission, no daemon: all mean "no Docker here"
        return False


class ContainerPool:
    """Starts, hands out and removes the containers of one process, keeping ``size`` idle ones per image.

    A pooled container has everything item-independent done before a session takes it: started with its limits,
    and whatever ``prepare`` does (the ``os`` task opens the agent's login shell), so a hand-over is a list pop.

    The first container tells whether the daemon can bound the writable space (:attr:`disk_bounded`, see
    :attr:`Limits.disk`): it is started with ``storage_opt`` and, if the daemon refuses that, without.

    Args:
        client: Docker client (default: from the environment).
        limits: Isolation of every container.
        size: Idle containers kept started per image (0: start one on demand for every session).
        reap_interval: Seconds between reaper runs after :meth:`start` (0: only at start).
        prepare: Run (in a thread) on every new container before it is handed out; its result is the lease's
            ``ready``, closed with the pool if still idle then (when it has ``close``). A container whose
            ``prepare`` raises is removed.
    """

    def __init__(self, client: docker.DockerClient | None = None, *, limits: Limits | None = None, size: int = 2,
                 reap_interval: float = 60.0, prepare: Callable[[Container], Any] | None = None) -> None:
        if size < 0:
            raise ValueError(f"pool size must be >= 0, got {size}")
        self.client = client or docker.from_env()
        self.limits = limits or Limits()
        self.size, self.reap_interval = size, reap_interval
        self.owner = this_owner()
        self.prepare = prepare
        self._idle: dict[str, list[Lease]] = defaultdict(list)
        self._live: set[str] = set()  # names of every container this pool started and has not removed
        self._refills: dict[str, asyncio.Task] = {}
        self._creating: set[asyncio.Task] = set()  # container starts in flight (threads outlive cancellation)
        self._removing: set[asyncio.Future] = set()  # removals in flight (see release)
        self._reaper: asyncio.Task | None = None
        # Whether the daemon bounds the writable space: None until the first container with a disk limit starts.
        self.disk_bounded: bool | None = None
        self._disk_probe = threading.Lock()

    async def start(self) -> None:
        """Reap leftovers (e.g. of a crashed predecessor) and start the periodic reaper."""
        await asyncio.to_thread(self.reap)
        if self.reap_interval > 0:
            self._reaper = asyncio.create_task(self._reap_loop())

    def warm(self, image: str) -> None:
        """Start filling the pool of ``image`` in the background (else it fills after the first :meth:`acquire`)."""
        if self.size and (image not in self._refills or self._refills[image].done()):
            self._refills[image] = asyncio.create_task(self._refill(image))

    async def acquire(self, image: str) -> Lease:
        """A running, prepared container of ``image``: an idle pooled one if there is one, else a new one."""
        idle = self._idle[image]
        lease = idle.pop() if idle else None
        self.warm(image)
        if lease is None:
            lease = await self._create_async(image)
        return lease

    async def release(self, container: Container) -> None:
        """Remove a container handed out by :meth:`acquire` (containers are never reused across sessions).

        The removal runs in the background (:meth:`close` waits for it): on btrfs the daemon walks the container's
        whole tree to remove it, seconds that the session's last answer need not wait for.
        """
        removal = asyncio.ensure_future(asyncio.to_thread(self._remove, container.name))
        self._removing.add(removal)
        removal.add_done_callback(self._removed)

    async def removals(self) -> None:
        """Wait until the containers released so far are removed (or their removal failed: the reaper retries)."""
        await asyncio.gather(*self._removing, return_exceptions=True)

    async def close(self) -> None:
        """Stop refilling and reaping; remove every container this pool started."""
        tasks = [t for t in (self._reaper, *self._refills.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # A cancelled start still finishes in its thread: wait for it, so that the reap below sees its container.
        await asyncio.gather(*self._creating, return_exceptions=True)
        await self.removals()
        for lease in (lease for idle in self._idle.values() for lease in idle):
            if hasattr(lease.ready, "close"):
                lease.ready.close()
        self._idle.clear()
        await asyncio.to_thread(self.reap, True)

    def reap(self, everything_of_mine: bool = False) -> list[str]:
        """Remove orphaned containers (see the module doc); also all of this process's if asked. Returns names."""
        orphans = []
        for name, owner in _sandbox_containers(self.client):
            if owner == self.owner:
                orphan = everything_of_mine or name not in self._live
            else:
                orphan = owner_alive(owner) is False
            if orphan:
                orphans.append(name)
        removed = remove_containers(self.client, orphans)
        self._live.difference_update(removed)
        if removed:
            logger.info("removed %d container(s): %s", len(removed), ", ".join(removed))
        return removed

    # ---- internals -----------------------------------------------------------------------------------

    async def _refill(self, image: str) -> None:
        # One container at a time: starting many at once only slows the sessions that are waiting.
        while len(self._idle[image]) < self.size:
            try:
                lease = await self._create_async(image)
            except Exception as e:  # noqa: BLE001 - Docker's or prepare's: the pool stays short, sessions start cold
                logger.warning("could not pre-start a container of %s: %s", image, e)
                return
            self._idle[image].append(lease)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval)
            try:
                await asyncio.to_thread(self.reap)
            except docker.errors.DockerException as e:
                logger.warning("reaper run failed: %s", e)

    def _removed(self, removal: asyncio.Future) -> None:
        self._removing.discard(removal)
        if not removal.cancelled() and removal.exception() is not None:  # the reaper retries it
            logger.warning("could not remove a container: %s", removal.exception())

    async def _create_async(self, image: str) -> Lease:
        task = asyncio.ensure_future(asyncio.to_thread(self._create, image))
        self._creating.add(task)
        task.add_done_callback(self._creating.discard)
        # Shielded: cancelling the caller must not orphan a start that :meth:`close` has to wait for.
        return await asyncio.shield(task)

    def _create(self, image: str) -> Lease:
        name = f"agentrl-{uuid.uuid4().hex[:16]}"
        # Registered before it exists, so that a concurrent reaper run never takes it for an orphan.
        self._live.add(name)
        try:
            container = None
            if self.disk_bounded is None and self.limits.disk is not None:
                with self._disk_probe:  # one probe: the others wait for its answer
                    if self.disk_bounded is None:
                        container = self._probe_disk_bound(image, name)
            if container is None:
                container = self._run(image, name, bool(self.disk_bounded))
            return Lease(container, self.prepare(container) if self.prepare is not None else None)
        except BaseException:
            self._live.discard(name)
            with contextlib.suppress(docker.errors.DockerException):
                self.client.containers.get(name).remove(force=True)
            raise

    def _probe_disk_bound(self, image: str, name: str) -> Container:
        """Start the first container with the daemon's bound on its writable space, else without it (warned)."""
        try:
            container = self._run(image, name, bounded=True)
        except docker.errors.APIError as refused:  # the daemon cannot (a failed create leaves no container)
            container = self._run(image, name, bounded=False)  # raises if it failed for another reason
            logger.warning("the Docker daemon cannot bound a container's writable space (%s): the disk limit %s "
                           "holds only per file, and the whole writable layer is checked after each command. "
                           "scripts/setup.sh starts a daemon that can (its data on xfs or btrfs with quotas).",
                           refused.explanation or refused, self.limits.disk)
            self.disk_bounded = False
            return container
        self.disk_bounded = True
        return container

    def _run(self, image: str, name: str, bounded: bool) -> Container:
        """Start a container; ``bounded``: the daemon bounds its writable space (else the per-file limit)."""
        return self.client.containers.run(
            image,
            ["sleep", "infinity"],
            name=name,
            detach=True,
            init=True,  # reaps the zombies of background jobs
            network_mode=self.limits.network,
            mem_limit=self.limits.memory,
            memswap_limit=self.limits.memory,
            nano_cpus=int(self.limits.cpus * 1e9),
            pids_limit=self.limits.pids,
            ulimits=self._ulimits(bounded),
            storage_opt={"size": self.limits.disk} if bounded else None,
            labels={LABEL_SANDBOX: "1", LABEL_OWNER: self.owner, LABEL_IMAGE: image},
        )

    def writable_bytes(self, container: Container) -> int:
        """Bytes in the container's writable layer (what it wrote to its file system)."""
        info = self.client.api.containers(all=True, filters={"id": container.id}, size=True)
        return int(info[0].get("SizeRw") or 0) if info else 0

    def over_disk_limit(self, container: Container) -> bool:
        """Whether the container wrote more than the disk limit; never where the daemon bounds it."""
        limit = self.limits.disk_bytes
        return limit is not None and self.disk_bounded is False and self.writable_bytes(container) > limit

    def _ulimits(self, disk_bounded: bool) -> list[Ulimit]:
        limits = []
        if self.limits.nofile is not None:
            limits.append(Ulimit(name="nofile", soft=self.limits.nofile, hard=self.limits.nofile))
        if self.limits.disk is not None and not disk_bounded:
            limits.append(Ulimit(name="fsize", soft=self.limits.disk_bytes, hard=self.limits.disk_bytes))
        return limits

    def _remove(self, name: str) -> None:
        remove_containers(self.client, [name])
        self._live.discard(name)
