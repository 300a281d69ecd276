"""How the suite spreads over ``pytest -n N --dist loadgroup`` workers (``scripts/test.sh``).

Each test module is one unit of work, so that its module-scoped fixtures (a running stack, a demo run) serve all of its
tests once. Exceptions: the demo module's tests that do not share its full run are units of their own, and the
modules that inspect the machine's shared memory (the vLLM ones) form one unit, so that no other test of theirs runs
beside them. Units start longest first (:data:`LONG_FIRST`, measured), so that the last to finish ends the suite soon;
the rest keep their order. Without ``-n`` the markers change nothing and only the order applies.
"""

from __future__ import annotations

import pytest

DEMO = "tests/agentrl_verl/harness/test_demo.py"
SHARED_UNITS = {
    "tests/agentrl_verl/backends/test_vllm_cpu.py": "vllm",
    "tests/agentrl_verl/e2e/test_vllm_e2e.py": "vllm",
}
LONG_FIRST = [
    DEMO,
    "vllm",
    "tests/agentrl_verl/e2e/test_cross_policy_e2e.py",
    "tests/agentrl_verl/e2e/test_async_e2e.py",
    "tests/agentrl_verl/e2e/test_main_ppo_cpu.py",
    f"{DEMO}::test_the_multitask_demo_runs_end_to_end_and_reports_every_family",
    "tests/agentrl_verl/e2e/test_faults_e2e.py",
    "tests/agentrl_verl/e2e/test_agentrl_e2e.py",
    f"{DEMO}::test_ctrl_c_during_rl_stops_everything",
]
"""The units that take minutes, longest first (``--durations`` of a whole run)."""


def _unit(item: pytest.Item) -> str:
    path = item.nodeid.split("::", 1)[0]
    if path == DEMO and "demo_run" not in getattr(item, "fixturenames", ()):
        return item.nodeid
    return SHARED_UNITS.get(path, path)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {unit: i for i, unit in enumerate(LONG_FIRST)}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_unit(item)))
    items.sort(key=lambda item: rank.get(_unit(item), len(rank)))
