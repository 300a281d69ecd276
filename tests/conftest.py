"""How the suite spreads over ``pytest -n N --dist loadfile`` workers (``scripts/test.sh``).

Each test module is one unit of work, so that its module-scoped fixtures (a running stack, the demo run) serve all of
its tests once. Units start longest first (:data:`LONG_FIRST`, measured), so that the last to finish ends the suite
soon; the rest keep their order. Without ``-n`` only the order applies. (Modules, not finer groups: pytest-xdist
3.8's ``loadgroup`` does not group on pytest 9.2, whose test ids no longer come from the attribute it renames.)
"""

from __future__ import annotations

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
