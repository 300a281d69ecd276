"""AgentRL on verl's real ``main_ppo`` (CPU): the ``agentrl_agent`` loop against a real environment stack of two
tasks, the ``task_norm_grpo`` estimator and the ``agentrl_sync`` trainer mode, with per-task metrics logged
through verl's tracking, on a Ray cluster of three raylets on this machine (Ray's ``cluster_utils.Cluster``), as a
user's cluster would be: verl's actors on the head, the environment's workers on two more nodes.

The run starts its own stack on that cluster (``agentrl.env.launch=ray``: controller and workers as Ray actors,
placed by custom resources), loses one of the environment's nodes while its sessions are in flight, and takes the
stack down at the end. The datasets come from ``make-data`` on a stack of the same tasks started here.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.request
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.tools.cli import main as agentrl_verl_cli
from env_adapters.http import auth_headers

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent

TOKEN = "agentrl-e2e-token"  # a stack over several nodes listens off loopback: a token is required
# Steps of half a second: an episode's sessions stay open long enough to be caught in flight on the lost node.
CHATTER = {"task": "latency_chatter_task:LatencyChatterTask", "name": "chatter", "concurrency": 8,
           "heartbeat_interval": 0.5, "options": {"rounds": 3, "size": 8, "step_latency": {"dist": "fixed", "s": 0.5}}}
CALC = {"task": "calc", "name": "calc", "concurrency": 8, "heartbeat_interval": 0.5, "options": {"size": 32}}
# The environment's nodes offer no CPU, so verl places nothing there, and TransferQueue's storage (which goes to the
# first node by id) is sent to the head by its resource; node A keeps calc and one chatter replica, node B has the
# other, and leaves.
HEAD = {"trainer_node": 1}
NODE_A = {"calc_node": 1, "chatter_node": 1}
NODE_B = {"chatter_node": 1}


def stack_config() -> dict:
    return {"controller": {"host": "0.0.0.0", "port": 0, "token": TOKEN, "heartbeat_timeout": 3,
                           "clean_interval": 0.5},
            "workers": [{**CALC, "ray": {"resources": {"calc_node": 1}}},
                        {**CHATTER, "replicas": 2, "ray": {"resources": {"chatter_node": 1}, "max_restarts": 0}}]}


def api(url: str, route: str) -> dict:
    request = urllib.request.Request(f"{url}/api/{route}", headers=auth_headers(TOKEN))
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())


def controller_url() -> str | None:
    """The URL of the run's controller: the stack controller process among this test's descendants (the cluster's
    raylets are its children; other tests' stacks may run beside it)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = proc.cmdline()
            if "env_adapters.cli" in cmdline and "controller" in cmdline:
                ports = [c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
                if ports:
                    return f"http://127.0.0.1:{ports[0]}"
        except psutil.Error:  # gone meanwhile
            continue
    return None


@pytest.fixture
def cluster(monkeypatch, ray_cluster):
    # The raylets start the stack's processes: they import the test task from this folder.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as the runs' own clusters (conftest's main_ppo)
    cluster, (_, *nodes) = ray_cluster({"num_cpus": 8, "num_gpus": 1, "resources": HEAD, "include_dashboard": False},
                                       [{"num_cpus": 0, "resources": r} for r in (NODE_A, NODE_B)])
    try:
        yield cluster, nodes
    finally:
        cluster.shutdown()


def test_two_tasks_train_on_a_stack_the_run_starts_over_the_cluster_and_lose_one_of_its_nodes(
        cluster, start_stack, tmp_path, run_main_ppo):
    cluster_, (node_a, node_b) = cluster
    with start_stack([CALC, CHATTER]) as env:
        assert agentrl_verl_cli(["make-data", "--controller", env.url, "--out", str(tmp_path), "--train-size", "16",
                                 "--val-fraction", "0.25", "--seed", "0"]) == 0
    assert set(pd.read_parquet(tmp_path / "train.parquet")["data_source"]) == {"calc", "chatter"}
    stack_file = tmp_path / "stack.yaml"
    stack_file.write_text(yaml.safe_dump(stack_config()))
    lost: dict = {}

    def lose_node_b_mid_episode(driver) -> None:
        # Once a session runs on node B's chatter worker, node B leaves the cluster (its raylet and every process
        # on it killed): the episodes in flight there lose their sessions.
        def watch() -> None:
            while driver.poll() is None:
                url = controller_url()
                try:
                    workers = api(url, "list_workers") if url else {}
                    on_b = {i for i, w in workers.get("chatter", {}).items() if w["node"] == node_b.node_id}
                    running = [s for s in api(url, "list_sessions").values()
                               if s["status"] == "running" and str(s["worker_id"]) in on_b] if on_b else []
                except OSError:  # the stack is still starting
                    running = []
                if running:
                    lost.update(url=url, sessions=len(running), placed=workers)
                    cluster_.remove_node(node_b)
                    return
                time.sleep(0.2)

        threading.Thread(target=watch, daemon=True).start()

    log, steps = run_main_ppo(
        tmp_path, build_tiny_model(), "agentrl",
        "trainer.total_training_steps=3",
        "algorithm.adv_estimator=task_norm_grpo",
        "trainer.v1.trainer_mode=agentrl_sync",
        "+agentrl.env.launch=ray",
        f"+agentrl.env.stack={stack_file}",
        "+agentrl.task_adv_norm=token",
        "+agentrl.agent.max_turns=3",
        "+agentrl.agent.max_new_tokens=24",
        "+agentrl.agent.max_total_tokens=400",
        "data.max_prompt_length=160",
        "data.max_response_length=160",
        "+transfer_queue.backend.SimpleStorage.required_node_resource=trainer_node",
        started=lose_node_b_mid_episode, ray_address=cluster_.address,
    )
    # The stack was spread as configured: calc on node A, one chatter replica on each node.
    assert lost, "no session ran on node B's worker"
    placed = {name: sorted(w["node"] for w in workers.values()) for name, workers in lost["placed"].items()}
    assert placed == {"calc": [node_a.node_id], "chatter": sorted([node_a.node_id, node_b.node_id])}
    assert sorted(steps) == [1, 2, 3]
    seen = set()
    for step, m in steps.items():
        # Every group was trained whole: the episodes on node B were played again on node A's worker, none
        # trained as an error.
        assert m["agentrl/all/episodes"] == 8, (step, m)  # 4 prompts x n=2
        statuses = sum(v for k, v in m.items() if k.startswith("agentrl/all/status/"))
        assert statuses == 8 and m.get("agentrl/all/status/task_error", 0) == 0, (step, m)
        for task in ("calc", "chatter"):
            if f"agentrl/{task}/episodes" in m:
                seen.add(task)
                for name in ("reward", "success_rate", "turns", "generated_tokens", "env_tokens", "env_latency_s"):
                    assert f"agentrl/{task}/{name}" in m, (step, task, name)
        if "agentrl/chatter/turns" in m:
            assert m["agentrl/chatter/turns"] > 1  # multi-turn episodes really ran
        assert m["actor/pg_loss"] == m["actor/pg_loss"]  # not NaN
    assert seen == {"calc", "chatter"}
    assert sum(m.get("agentrl/chatter/env_retries", 0) for m in steps.values()) > 0
    url = re.search(r"environment stack of \S+ up at (http://[\d.]+:\d+) for this run \(3 workers\)", log).group(1)
    assert url.rsplit(":", 1)[1] == lost["url"].rsplit(":", 1)[1]
    with pytest.raises(OSError):  # the run's controller went with the run
        api(url, "list_workers")
    # Nothing of the run is left: neither the stack's processes (its workers name its controller's port) nor a
    # named actor (the stack's, TransferQueue's) on the cluster.
    port = f":{url.rsplit(':', 1)[1]}"
    stack_processes = [p for p in psutil.process_iter(["cmdline"])
                       if "env_adapters.cli" in (cmdline := p.info["cmdline"] or []) and port in " ".join(cmdline)]
    assert stack_processes == []
    ray.init(address=cluster_.address, log_to_driver=False)
    try:
        named = ray.util.list_named_actors(all_namespaces=True)
    finally:
        ray.shutdown()
    assert named == []
