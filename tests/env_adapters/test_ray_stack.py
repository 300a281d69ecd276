"""The stack on a Ray cluster of three raylets on this machine (Ray's own ``cluster_utils.Cluster``): placement by
custom resources, a killed worker restarted by Ray, a node that leaves and one that joins; and on three hosts of
their own addresses (network namespaces, ``netns_hosts``): workers on their host's address, the token off loopback,
``up --ray`` ended with Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from env_adapters.client import EnvClient, EnvRequestError
from env_adapters.launcher import load_config
from env_adapters.ray_stack import RayEnvStack, StackStartError
from env_adapters.sandbox.containers import docker_available

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

CALL = {"id": "c1", "type": "function",
        "function": {"name": "calculate", "arguments": json.dumps({"expression": "1+1"})}}
STEP = {"role": "assistant", "content": "", "tool_calls": [CALL]}
TOKEN = "ray-stack-test-token"
# Every node offers one "calc" slot, so three replicas that take one each land one per node; only the second node
# offers "special".
NODE_RESOURCES = [{"calc": 1}, {"calc": 1, "special": 1}, {"calc": 1}]


def stack_config(**controller) -> dict:
    return {"controller": {"host": "0.0.0.0", "port": 0, "token": TOKEN, "heartbeat_timeout": 3,
                           "clean_interval": 0.5, **controller},
            "workers": [{"task": "calc", "replicas": 3, "concurrency": 4, "heartbeat_interval": 0.5,
                         "ray": {"resources": {"calc": 1}, "max_restarts": 2}},
                        {"task": "calc", "name": "special", "concurrency": 2, "heartbeat_interval": 0.5,
                         "ray": {"resources": {"special": 1}}}]}


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    cluster, nodes = ray_cluster({"num_cpus": 1, "resources": NODE_RESOURCES[0], "include_dashboard": False},
                                 [{"num_cpus": 1, "resources": r} for r in NODE_RESOURCES[1:]])
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


def node_ids_by_resource() -> dict[str, set[str]]:
    """The ids of the alive nodes offering each custom resource of :data:`NODE_RESOURCES`."""
    out: dict[str, set[str]] = {}
    for node in ray.nodes():
        if node["Alive"]:
            for resource in ("calc", "special"):
                if resource in node["Resources"]:
                    out.setdefault(resource, set()).add(node["NodeID"])
    return out


async def until_alive_on(env: EnvClient, nodes: list[str], timeout: float) -> None:
    """Wait until the alive ``calc`` workers are exactly one on each of ``nodes``."""
    deadline = time.monotonic() + timeout
    while alive_nodes(await env.list_workers()) != sorted(nodes):
        assert time.monotonic() < deadline, (nodes, await env.list_workers())
        await asyncio.sleep(0.5)


def alive_nodes(workers: dict, name: str = "calc") -> list[str]:
    return sorted(w["node"] for w in workers.get(name, {}).values() if w["alive"])


def test_placement_is_validated_and_ignored_without_ray():
    config = load_config(stack_config())
    assert config.workers[0].ray.resources == {"calc": 1} and config.workers[1].ray.max_restarts == 3
    with pytest.raises(ValueError, match="num_gpus"):
        load_config({"workers": [{"task": "calc", "ray": {"num_gpus": 1}}]})


def test_an_openenv_entry_is_refused_on_ray_naming_the_command_to_run_instead():
    stack = RayEnvStack({"openenv": {"port": 0}, "workers": [{"task": "calc"}]}, address="127.0.0.1:1")
    with pytest.raises(StackStartError, match="run `agentrl-env openenv --controller URL`"):
        stack.start()


def test_a_stack_over_several_nodes_needs_a_token(cluster):
    config = stack_config(token=None)
    with pytest.raises(StackStartError, match="3 nodes.*token_file"):
        RayEnvStack(config).start()


async def test_replicas_are_spread_by_resource_and_ray_restarts_a_killed_one(cluster):
    by_resource = node_ids_by_resource()
    with RayEnvStack(stack_config(), startup_timeout=120) as stack:
        assert not stack.url.startswith("http://0.0.0.0")  # the controller's node address, reachable from the others
        async with EnvClient(stack.url, token=TOKEN) as env:
            workers = await env.list_workers()
            # One replica per node offering "calc"; the "special" entry only where "special" is.
            assert alive_nodes(workers) == sorted(by_resource["calc"])
            assert alive_nodes(workers, "special") == sorted(by_resource["special"])
            # Three raylets of one host: the workers listen on loopback (on several hosts, their node's address).
            assert all(w["address"].startswith("http://127.0.0.1:") for task in workers.values() for w in task.values())

            session = await env.start_sample("calc", 0)
            worker_id = (await env.list_sessions())[str(session.session_id)]["worker_id"]
            node = workers["calc"][str(worker_id)]["node"]
            victim = next(i for i, place in enumerate(stack.nodes()) if place["node_id"] == node
                          and place["label"].startswith("worker0."))
            stack.kill_worker(victim)
            reply = await env.interact(session.session_id, STEP)
            assert (reply.finish, reply.status) == (True, "task error")
            # Ray restarts the actor, and with it the worker, which registers again on the same node.
            await until_alive_on(env, list(by_resource["calc"]), timeout=90)
            again = await env.start_sample("calc", 1)
            assert (await env.interact(again.session_id, STEP)).status == "running"
            assert stack.workers[victim][1].poll() is None  # still Ray's to keep
            pids = [place["pid"] for place in stack.nodes()]
    assert len(pids) == 4 and not [pid for pid in pids if Path(f"/proc/{pid}").exists()]  # every worker stopped


NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
"""The environment of a host whose Docker daemon does not answer."""


@pytest.fixture
def hosts(ray_hosts):
    """Three hosts of their own addresses (network namespaces), one Ray node each; the third has no Docker."""
    with ray_hosts(NODE_RESOURCES, env={2: NO_DOCKER}) as hosts:
        yield hosts


def up_command(hosts, config: Path) -> list[str]:
    return [sys.executable, "-m", "env_adapters.cli", "up", str(config), "--ray", hosts.address]


async def test_up_with_ray_spans_hosts_on_their_own_addresses_until_ctrl_c(hosts, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    config, loopback, docker = tmp_path / "stack.yaml", tmp_path / "loopback.yaml", tmp_path / "docker.yaml"
    config.write_text(yaml.safe_dump(stack_config(token=None, token_file=str(token_file))))
    loopback.write_text(yaml.safe_dump(stack_config(host="127.0.0.1")))
    # os on the host offering "special" (its daemon answers), and os anywhere (the third host's does not).
    docker.write_text(yaml.safe_dump({**stack_config(), "workers": [
        {"task": "os", "name": "os_special", "ray": {"resources": {"special": 1}}}, {"task": "os"}]}))

    # All three at once, as drivers of one cluster. Refused before anything starts: a controller on loopback, which
    # the other hosts cannot reach; a Docker family whose placement admits a host whose daemon does not answer (every
    # admitted host is asked).
    procs = {case: hosts.popen(0, up_command(hosts, case), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True) for case in (config, loopback, docker)}
    proc = procs[config]
    try:
        errors = {case: procs[case].stderr.read() for case in (loopback, docker)}
        assert [procs[case].wait(timeout=120) != 0 for case in (loopback, docker)] == [True, True]
        assert "controller.host is 127.0.0.1" in errors[loopback]
        silent = re.search(r"entry (\S+) runs os, which needs Docker.*does not answer: (.*)\. Declare", errors[docker])
        assert silent and silent.group(1) == "os", errors[docker]  # the entry on "special" passed
        assert hosts.ips[2] in silent.group(2) and (hosts.ips[0] in silent.group(2)) is not docker_available()

        url = next(m.group(1) for line in proc.stderr if (m := re.search(r"controller URL: (\S+)", line)))
        assert urlsplit(url).hostname == hosts.ips[0]  # the controller's node address, not 0.0.0.0
        # From this machine's own namespace, as from any host of the bridge:
        async with EnvClient(url, token=TOKEN) as env:
            workers = await env.list_workers()
            # Each worker listens on its own host's address, where the controller on the first host reaches it.
            assert worker_hosts(workers) == sorted(hosts.ips)
            assert worker_hosts(workers, "special") == [hosts.ips[1]]  # the one host offering "special"
            sessions = [await env.start_sample("calc", i) for i in range(3)]  # least loaded: one per worker
            placed = await env.list_sessions()
            assert sorted(urlsplit(workers["calc"][str(placed[str(s.session_id)]["worker_id"])]["address"]).hostname
                          for s in sessions) == sorted(hosts.ips)
            for s in sessions:
                assert (await env.interact(s.session_id, STEP)).status == "running"
        # Off loopback, the controller and every worker answer only with the token.
        async with EnvClient(url) as anonymous:
            with pytest.raises(EnvRequestError) as denied:
                await anonymous.list_workers()
            assert denied.value.status_code == 401
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the bridge, never a proxy
        for worker in workers["calc"].values():
            with pytest.raises(urllib.error.HTTPError) as denied:
                direct.open(f"{worker['address']}/api/worker_status", timeout=30)
            assert denied.value.code == 401
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        for left in procs.values():
            if left.poll() is None:
                left.kill()
    # The command's actors went with it, and with them every stack process on every host.
    deadline = time.monotonic() + 60
    while leftovers := [cmd for host in range(3) for cmd in hosts.processes(host)
                        if "ProcessHost" in cmd or "env_adapters.cli" in cmd]:
        assert time.monotonic() < deadline, leftovers
        time.sleep(0.5)


def worker_hosts(workers: dict, name: str = "calc") -> list[str]:
    return sorted(urlsplit(w["address"]).hostname for w in workers.get(name, {}).values() if w["alive"])


async def test_a_node_that_leaves_takes_its_workers_and_one_that_joins_gets_them_back(cluster):
    cluster_, nodes = cluster
    with RayEnvStack(stack_config(), startup_timeout=120) as stack:
        async with EnvClient(stack.url, token=TOKEN) as env:
            leaving = nodes[2]
            sessions = [await env.start_sample("calc", i) for i in range(6)]  # least loaded: two per worker
            placed = await env.list_sessions()
            workers = await env.list_workers()
            node_of = {int(i): w["node"] for i, w in workers["calc"].items()}
            on_leaving = [s for s in sessions if node_of[placed[str(s.session_id)]["worker_id"]] == leaving.node_id]
            assert len(on_leaving) == 2
            cluster_.remove_node(leaving)
            await until_alive_on(env, [nodes[0].node_id, nodes[1].node_id], timeout=60)
            # The dead worker's sessions ended "task error" when the controller saw it go; the others go on.
            status = {int(i): info["status"] for i, info in (await env.list_sessions()).items()}
            for s in on_leaving:
                assert status[s.session_id] == "task error", status
            for s in (s for s in sessions if s not in on_leaving):
                assert (await env.interact(s.session_id, STEP)).status == "running"
            # New sessions go to the two nodes left.
            for i in range(3):
                s = await env.start_sample("calc", 10 + i)
                worker = (await env.list_sessions())[str(s.session_id)]["worker_id"]
                assert node_of.get(worker) in {nodes[0].node_id, nodes[1].node_id}
            # Capacity returns: Ray places the lost replica on the node that joins.
            joined = cluster_.add_node(num_cpus=1, resources=NODE_RESOURCES[2])
            await until_alive_on(env, [nodes[0].node_id, nodes[1].node_id, joined.node_id], timeout=120)
    assert ray.util.list_named_actors(all_namespaces=True) == []  # nothing of the stack is left on the cluster
