"""How the suite spreads over ``pytest -n N --dist loadfile`` workers (``scripts/test.sh``), and the multi-node Ray
cluster of the tests that need one (``ray_cluster``).

Each test module is one unit of work, so that its module-scoped fixtures (a running stack, the demo run) serve all of
its tests once. Units start longest first (:data:`LONG_FIRST`, measured), so that the last to finish ends the suite
soon; the rest keep their order. Without ``-n`` only the order applies. (Modules, not finer groups: pytest-xdist
3.8's ``loadgroup`` does not group on pytest 9.2, whose test ids no longer come from the attribute it renames.)
"""

from __future__ import annotations

from collections.abc import Callable
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
