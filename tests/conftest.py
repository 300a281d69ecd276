"""How the suite spreads over ``pytest -n N --dist loadfile`` workers (``scripts/test.sh``), the multi-node Ray
cluster of the tests that need one (``ray_cluster``), and an OpenEnv environment that is not ours (``echo_env_url``).

Each test module is one unit of work, so that its module-scoped fixtures (a running stack, the demo run) serve all of
its tests once. Units start longest first (:data:`LONG_FIRST`, measured), so that the last to finish ends the suite
soon; the rest keep their order. Without ``-n`` only the order applies. (Modules, not finer groups: pytest-xdist
3.8's ``loadgroup`` does not group on pytest 9.2, whose test ids no longer come from the attribute it renames.)
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

LONG_FIRST = [
    "tests/agentrl_verl/harness/test_demo.py",
    "tests/agentrl_verl/e2e/test_vllm_e2e.py",
    "tests/agentrl_verl/e2e/test_cross_policy_e2e.py",
    "tests/agentrl_verl/e2e/test_async_e2e.py",
    "tests/agentrl_verl/e2e/test_faults_e2e.py",
    "tests/agentrl_verl/e2e/test_main_ppo_cpu.py",
    "tests/agentrl_verl/e2e/test_agentrl_e2e.py",
    "tests/agentrl_verl/e2e/test_openenv_e2e.py",
]
"""The modules that take minutes, longest first (``--durations`` of a whole run)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def start_ray_cluster(head: dict[str, Any], nodes: list[dict[str, Any]]) -> tuple[Any, list[Any]]:
    """A Ray cluster of raylets on this machine (``ray.cluster_utils.Cluster``): a head of ``head``'s arguments and a
    node per entry of ``nodes``; returns it and its nodes, the head first. A raylet that misses Ray's fixed 30 s
    start-up wait (a loaded machine) is started once more, as the demo does."""
    from ray.cluster_utils import Cluster

    from agentrl_verl.pipeline.launch import RAY_START_TIMEOUT

    for attempt in range(2):
        cluster = Cluster()
        try:
            started = [cluster.add_node(**head)] + [cluster.add_node(**node) for node in nodes]
            cluster.wait_for_nodes()
            return cluster, started
        except Exception as e:
            cluster.shutdown()
            if attempt or RAY_START_TIMEOUT not in str(e):
                raise
    raise AssertionError("unreachable")


@pytest.fixture(name="ray_cluster", scope="session")
def _ray_cluster() -> Callable[..., tuple[Any, list[Any]]]:
    return start_ray_cluster


# Serves the scaffolded environment's app on a free loopback port, which it prints first.
SERVE_ECHO_ENV = """
import socket, sys, uvicorn
sys.path.insert(0, sys.argv[1])
from echo_env.server.app import app
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
"""
ECHO_ENV_TIMEOUT_S = 180  # openenv imports gradio and fastmcp: 10-45 s on the 2-core machine


@pytest.fixture(scope="session")
def echo_env_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of the echo environment that OpenEnv's CLI scaffolds (``openenv init echo_env``), served with the
    concurrent sessions its template's comment says to raise; stopped at the end."""
    pytest.importorskip("openenv")
    root = tmp_path_factory.mktemp("openenv")
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env", "-o", str(root)], check=True,
                   capture_output=True, timeout=ECHO_ENV_TIMEOUT_S)
    app = root / "echo_env" / "server" / "app.py"
    source = app.read_text()
    assert "max_concurrent_envs=1," in source, "OpenEnv's scaffold changed: its app no longer sets one session"
    app.write_text(source.replace("max_concurrent_envs=1,", "max_concurrent_envs=16,"))
    server = subprocess.Popen([sys.executable, "-c", SERVE_ECHO_ENV, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        deadline = time.monotonic() + ECHO_ENV_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the echo environment did not start"
                time.sleep(0.2)
        yield url
    finally:
        server.kill()
        server.wait()
