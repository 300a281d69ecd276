"""Container isolation, ownership labels, the pool and the reaper, against the real Docker daemon; how the pool
decides between the daemon's disk bound and the fallback, against a stand-in client."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
from types import SimpleNamespace

import pytest

docker = pytest.importorskip("docker")

from env_adapters.sandbox.containers import (  # noqa: E402
    LABEL_OWNER,
    LABEL_SANDBOX,
    ContainerPool,
    Limits,
    owner_alive,
    remove_orphans,
    this_owner,
)

# What a write past the daemon's bound says: btrfs quotas, xfs project quotas.
DISK_FULL = ("Disk quota exceeded", "No space left on device")


@pytest.fixture
async def pool(docker_client):
    limits = Limits(memory="256m", cpus=0.5, pids=64, disk="8m", nofile=4096)
    pool = ContainerPool(docker_client, limits=limits, size=1, reap_interval=0)
    yield pool
    await pool.close()


def _exists(client, name: str) -> bool:
    try:
        client.containers.get(name)
    except docker.errors.NotFound:
        return False
    return True


def test_owner_labels_name_a_live_process():
    assert owner_alive(this_owner()) is True
    proc = subprocess.Popen(["true"])
    proc.wait()
    dead = this_owner().split(":")
    dead[1] = str(proc.pid)
    assert owner_alive(":".join(dead)) is False
    assert owner_alive("some-other-host:1:1") is None


@pytest.mark.slow
@pytest.mark.docker
async def test_containers_are_isolated_and_labelled(pool, os_image):
    container = (await pool.acquire(os_image)).container
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["Memory"] == 256 * 2**20 and host["MemorySwap"] == 256 * 2**20
    assert host["PidsLimit"] == 64 and host["NanoCpus"] == 500_000_000
    assert container.labels[LABEL_SANDBOX] == "1" and container.labels[LABEL_OWNER] == pool.owner
    code, out = container.exec_run(["ls", "/sys/class/net"])
    assert out.split() == [b"lo"]
    code, _ = container.exec_run(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), 2)"])
    assert code != 0
    code, out = container.exec_run(["bash", "-c", "ulimit -Sn; ulimit -Hn"])
    assert out == b"4096\n4096\n"
    await pool.release(container)  # removed in the background
    await pool.removals()
    assert not _exists(pool.client, container.name)


@pytest.mark.slow
@pytest.mark.docker
async def test_the_daemon_bounds_the_writable_space_everywhere(pool, os_image):
    container = (await pool.acquire(os_image)).container
    if not pool.disk_bounded:
        pytest.skip("this Docker daemon cannot bound a container's writable space (scripts/setup.sh starts one "
                    "that can): the fallback is tested instead")
    # One file may take the whole limit (no per-file limit); the next write anywhere fails.
    code, out = container.exec_run(["bash", "-c", "exec 2>&1; head -c 6M /dev/zero > /root/a; echo a=$?; "
                                                  "head -c 6M /dev/zero > /usr/b; echo b=$?; sync; "
                                                  "du -ck /root/a /usr/b | tail -1"])
    text = out.decode()
    assert "a=0" in text and "b=1" in text and any(m in text for m in DISK_FULL), text
    assert int(text.split()[-2]) <= 8 * 1024  # KiB written in all
    assert "fsize" not in str(container.attrs["HostConfig"]["Ulimits"]) and not pool.over_disk_limit(container)
    # Deleting makes room again.
    code, out = container.exec_run(["bash", "-c", "rm /usr/b; sync; head -c 1M /dev/zero > /etc/c && echo room"])
    assert out == b"room\n"
    await pool.release(container)


@pytest.mark.slow
@pytest.mark.docker
async def test_without_the_daemons_bound_no_file_grows_past_the_limit(pool, os_image):
    container = (await pool.acquire(os_image)).container
    if pool.disk_bounded:
        pytest.skip("this Docker daemon bounds a container's writable space: the fallback is not used")
    # One stream (exec 2>&1): bash's "File size limit exceeded" comes before what follows it.
    code, out = container.exec_run(["bash", "-c", "exec 2>&1; head -c 12M /dev/zero > /big; echo $?; stat -c %s /big"])
    assert out.split(b"\n")[-3:] == [b"153", str(8 * 2**20).encode(), b""] and b"File size limit exceeded" in out
    # What was written counts in the writable layer: two files past the limit together are found after the fact.
    assert 8 * 2**20 <= pool.writable_bytes(container) < 9 * 2**20 and not pool.over_disk_limit(container)
    container.exec_run(["bash", "-c", "head -c 4M /dev/zero > /usr/more"])
    assert pool.over_disk_limit(container)
    await pool.release(container)


@pytest.mark.slow
@pytest.mark.docker
async def test_pool_hands_out_prestarted_containers_and_refills(pool, os_image):
    pool.warm(os_image)
    await pool._refills[os_image]
    idle = pool._idle[os_image][0].container
    container = (await pool.acquire(os_image)).container
    assert container.id == idle.id
    await pool._refills[os_image]
    assert len(pool._idle[os_image]) == 1 and pool._idle[os_image][0].container.id != container.id
    await pool.release(container)


@pytest.mark.slow
@pytest.mark.docker
async def test_reaper_removes_orphans_and_spares_the_living(pool, docker_client, os_image):
    client, image = docker_client, os_image
    proc = subprocess.Popen(["true"])
    proc.wait()
    host = socket.gethostname()
    labels = {LABEL_SANDBOX: "1"}
    made = {
        "dead": client.containers.create(image, ["true"], labels={**labels, LABEL_OWNER: f"{host}:{proc.pid}:1"}),
        "remote": client.containers.create(image, ["true"], labels={**labels, LABEL_OWNER: "elsewhere:1:1"}),
        # Ours but in no session and not in the pool: a session that ended without cleaning up.
        "stray": client.containers.create(image, ["true"], labels={**labels, LABEL_OWNER: pool.owner}),
    }
    live = (await pool.acquire(image)).container
    try:
        removed = pool.reap()
        assert {made["dead"].name, made["stray"].name} <= set(removed)
        assert not _exists(client, made["dead"].name) and not _exists(client, made["stray"].name)
        assert _exists(client, made["remote"].name) and _exists(client, live.name)
    finally:
        made["remote"].remove(force=True)
    await pool.close()
    assert not _exists(client, live.name)
    assert not client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={pool.owner}"})


class _Daemon:
    """Stands in for a Docker client whose daemon bounds a container's writable space or refuses to."""

    def __init__(self, bounds: bool) -> None:
        self.bounds, self.runs, self.removed = bounds, [], []
        self.containers = SimpleNamespace(run=self._run, get=lambda name: SimpleNamespace(
            remove=lambda force: self.removed.append(name)))

    def _run(self, image: str, command: list[str], **options):
        self.runs.append(options)
        if options["storage_opt"] and not self.bounds:
            raise docker.errors.APIError("500 Server Error", explanation="--storage-opt is supported only for "
                                                                          "overlay over xfs with 'pquota' mount option")
        return SimpleNamespace(name=options["name"])


def _fsize(options) -> list:
    return [u for u in options["ulimits"] if u["Name"] == "fsize"]


@pytest.mark.parametrize("bounds", [True, False])
async def test_the_first_container_decides_between_the_daemons_bound_and_the_fallback(bounds, caplog):
    daemon = _Daemon(bounds)
    pool = ContainerPool(daemon, limits=Limits(disk="8m"), size=0)
    with caplog.at_level(logging.WARNING, logger="env_adapters.sandbox.containers"):
        await asyncio.gather(*(pool.acquire("image") for _ in range(4)))
        await pool.acquire("image")
    assert pool.disk_bounded is bounds
    asked = [o for o in daemon.runs if o["storage_opt"]]
    if bounds:  # every container bounded by the daemon, none by the per-file limit
        assert len(asked) == 5 and all(o["storage_opt"] == {"size": "8m"} and not _fsize(o) for o in asked)
        assert not pool.over_disk_limit(SimpleNamespace(id="x"))  # nothing to check (the stand-in has no API)
    else:  # asked once, then the fallback for all: one warning that names the daemon's reason
        assert len(asked) == 1 and len(daemon.runs) == 6
        assert all(_fsize(o) == [{"Name": "fsize", "Soft": 8 * 2**20, "Hard": 8 * 2**20}] for o in daemon.runs[1:])
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1 and "'pquota'" in warnings[0] and "8m" in warnings[0]


async def test_a_pool_without_disk_limit_asks_for_neither():
    daemon = _Daemon(bounds=False)
    pool = ContainerPool(daemon, limits=Limits(disk=None), size=0)
    await pool.acquire("image")
    assert pool.disk_bounded is None and not daemon.runs[0]["storage_opt"] and not _fsize(daemon.runs[0])
    assert not pool.over_disk_limit(SimpleNamespace(id="x"))


async def test_a_pooled_container_is_handed_over_prepared_and_a_failed_preparation_removes_it():
    prepared, calls = [], []

    def prepare(container):
        calls.append(container.name)
        if len(calls) == 2:
            raise RuntimeError("no shell")
        prepared.append(container.name)
        return f"shell of {container.name}"

    daemon = _Daemon(bounds=True)
    pool = ContainerPool(daemon, limits=Limits(disk=None), size=1, prepare=prepare)
    pool.warm("image")
    await pool._refills["image"]
    lease = await pool.acquire("image")  # the pooled one, prepared before it was asked for
    assert lease.ready == f"shell of {lease.container.name}" and prepared == [lease.container.name]
    await pool._refills["image"]  # the refill after the hand-over fails to prepare its container: removed
    assert daemon.removed == [daemon.runs[1]["name"]] and not pool._idle["image"]
    lease = await pool.acquire("image")  # started on demand, prepared all the same
    assert lease.ready == f"shell of {lease.container.name}"


async def test_containers_get_no_network_unless_the_pool_is_given_one():
    daemon = _Daemon(bounds=True)
    await ContainerPool(daemon, limits=Limits(), size=0).acquire("image")
    await ContainerPool(daemon, limits=Limits(network="bridge"), size=0).acquire("image")
    assert [o["network_mode"] for o in daemon.runs] == ["none", "bridge"]


@pytest.mark.docker
def test_remove_orphans_takes_every_dead_owners_container_and_only_those(docker_client, os_image):
    client = docker_client
    proc = subprocess.Popen(["true"])
    proc.wait()
    host, labels = socket.gethostname(), {LABEL_SANDBOX: "1"}
    dead = [client.containers.create(os_image, ["true"], labels={**labels, LABEL_OWNER: f"{host}:{proc.pid}:1"})
            for _ in range(3)]
    kept = [client.containers.create(os_image, ["true"], labels={**labels, LABEL_OWNER: owner})
            for owner in ("elsewhere:1:1", this_owner())]
    try:
        assert set(remove_orphans(client)) >= {c.name for c in dead}
        assert not any(_exists(client, c.name) for c in dead)
        assert all(_exists(client, c.name) for c in kept)
    finally:
        for container in kept:
            container.remove(force=True)
