"""The stack on Ray nodes with addresses of their own, as on several hosts: a head raylet here and two more in network
namespaces of this machine, joined by a bridge on a private subnet (traffic only to loopback and to those
namespaces). The controller listens off loopback behind its token and each worker on its own node's address."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from env_adapters.client import EnvClient, EnvRequestError
from env_adapters.ray_stack import RayEnvStack, StackStartError

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

SUBNET = "10.213.7"
HEAD_IP = f"{SUBNET}.1"
BRIDGE = "agentrl-br"
NAMESPACES = {"agentrl-h1": f"{SUBNET}.2", "agentrl-h2": f"{SUBNET}.3"}
"""Network namespace -> the address of its raylet (its only interface besides its own loopback)."""
TOKEN = "hosts-test-token"
CALL = {"id": "c1", "type": "function",
        "function": {"name": "calculate", "arguments": json.dumps({"expression": "2*3"})}}
STEP = {"role": "assistant", "content": "", "tool_calls": [CALL]}
NODES_UP_S = 120


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _remove_network() -> None:
    for name in NAMESPACES:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # takes its end of the veth pair along
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


@pytest.fixture(scope="module")
def network() -> Iterator[None]:
    """A bridge holding :data:`HEAD_IP`, and one namespace per entry of :data:`NAMESPACES` wired to it."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    _remove_network()  # what a killed run of this module left
    try:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{HEAD_IP}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for i, (name, address) in enumerate(NAMESPACES.items()):
            inside, outside = f"agentrl-v{i}i", f"agentrl-v{i}o"
            _ip("netns", "add", name)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", name)
            _ip("link", "set", outside, "master", BRIDGE, "up")
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", inside)
            _ip("-n", name, "link", "set", inside, "up")
            _ip("-n", name, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        _remove_network()
        pytest.skip(f"cannot make network namespaces here: {e.stderr.strip()}")
    try:
        yield
    finally:
        _remove_network()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop ``ray start --block`` processes and every process of their nodes (each its own process group): SIGTERM
    all (``--block`` stops its node's processes on it), SIGKILL what is left after 10 s."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def cluster(network, tmp_path_factory) -> Iterator[list[str]]:
    """The three raylets (the head here, one in each namespace; only the namespaced ones offer ``calc``), this
    process connected as the head's driver; yields the nodes' addresses."""
    ray_cli = str(Path(sys.executable).with_name("ray"))
    temp_dir = tmp_path_factory.mktemp("ray_hosts")
    common = ["--block", "--num-cpus=1", "--disable-usage-stats", f"--temp-dir={temp_dir}"]
    # The raylets' connection to the GCS: 5 s by default, which a loaded machine can miss.
    env = {**os.environ, "RAY_gcs_rpc_server_connect_timeout_s": "60"}
    procs: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + NODES_UP_S
        for _ in range(3):  # the GCS port is picked free, and another process may bind it first: pick again
            address = f"{HEAD_IP}:{_free_port(HEAD_IP)}"
            procs = [subprocess.Popen([ray_cli, "start", "--head", f"--node-ip-address={HEAD_IP}",
                                       f"--port={address.rsplit(':', 1)[1]}", "--include-dashboard=false", *common],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                      env=env)]
            while (procs[0].poll() is None and subprocess.run([ray_cli, "status", f"--address={address}"],
                                                              capture_output=True).returncode != 0):
                assert time.monotonic() < deadline, "the head node did not start"
                time.sleep(1)
            if procs[0].poll() is None:
                break
            _stop(procs)
        assert procs[0].poll() is None, "the head node did not start"
        _connect(address)
        for count, (name, node_ip) in enumerate(NAMESPACES.items(), start=2):
            # One at a time: raylets of one machine starting at once race for their log files' names.
            with open(temp_dir / f"{name}.log", "w") as log:
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", name, ray_cli, "start", f"--address={address}",
                     f"--node-ip-address={node_ip}", '--resources={"calc": 1}', *common],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env))
            while len([n for n in ray.nodes() if n["Alive"]]) < count:
                assert time.monotonic() < deadline and procs[-1].poll() is None, (
                    f"the raylet in {name} did not join: {(temp_dir / f'{name}.log').read_text()[-2000:]}")
                time.sleep(1)
        yield sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    finally:
        ray.shutdown()
        _stop(procs)


def _connect(address: str, attempts: int = 3) -> None:
    """``ray.init`` to the head: its connection to the GCS times out after a fixed 5 s
    (``gcs_rpc_server_connect_timeout_s``, read once per process), which a loaded machine can miss."""
    for attempt in range(attempts):
        try:
            ray.init(address=address, _node_ip_address=HEAD_IP, log_to_driver=False)
            return
        except ray.exceptions.RpcError:
            ray.shutdown()
            if attempt == attempts - 1:
                raise


def stack_config(**controller) -> dict:
    return {"controller": {"host": "0.0.0.0", "port": 0, "token": TOKEN, **controller},
            "workers": [{"task": "calc", "replicas": 2, "concurrency": 4, "heartbeat_interval": 0.5,
                         "ray": {"resources": {"calc": 1}}}]}


async def test_workers_listen_on_their_nodes_address_and_every_request_needs_the_token(cluster):
    assert cluster == sorted([HEAD_IP, *NAMESPACES.values()])
    with RayEnvStack(stack_config(), startup_timeout=120) as stack:
        # The controller runs on the driver's node and is reached at that node's address.
        assert urlsplit(stack.url).hostname == HEAD_IP
        with pytest.raises(EnvRequestError) as refused:
            async with EnvClient(stack.url) as anonymous:
                await anonymous.list_workers()
        assert refused.value.status_code == 401
        async with EnvClient(stack.url, token=TOKEN) as env:
            workers = (await env.list_workers())["calc"].values()
            # One replica in each namespace, listening on that node's address (not loopback, which the controller
            # could not reach there).
            assert sorted(urlsplit(w["address"]).hostname for w in workers if w["alive"]) == sorted(
                NAMESPACES.values())
            sessions = [await env.start_sample("calc", i) for i in range(4)]  # two per worker: both serve
            placed = await env.list_sessions()
            assert len({placed[str(s.session_id)]["worker_id"] for s in sessions}) == 2
            for session in sessions:
                assert (await env.interact(session.session_id, STEP)).status == "running"
    assert ray.util.list_named_actors(all_namespaces=True) == []  # nothing of the stack is left on the cluster


def test_a_controller_on_loopback_is_refused_when_the_workers_are_on_other_hosts(cluster):
    with pytest.raises(StackStartError, match=r"controller.host is 127.0.0.1.*cannot reach"):
        RayEnvStack(stack_config(host="127.0.0.1")).start()
