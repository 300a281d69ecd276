"""Expert demonstrations from the families' real tasks, played in-process."""

from __future__ import annotations

import pytest

from env_adapters.demonstrations import generate_demonstrations


@pytest.fixture(scope="module")
def demos():
    return generate_demonstrations("calc", range(20), {"size": 50})


def test_demonstrations_solve_the_real_task(demos):
    assert len(demos) == 20
    for demo in demos:
        assert demo.success and demo.reward == 1.0
        roles = [m["role"] for m in demo.messages]
        assert roles == ["user", "assistant", "tool", "assistant"]
        assert [m["tool_calls"][0]["function"]["name"] for m in demo.messages if m["role"] == "assistant"] == [
            "calculate", "submit"]
        assert {t["function"]["name"] for t in demo.tools} == {"calculate", "submit"}


@pytest.mark.parametrize("family, options", [("db", {}), ("kg", {"preset": "easy", "prompt": "short", "size": 40}),
                                             ("webshop", {"preset": "easy"}),
                                             ("alfworld", {"task_types": ["pick_and_place_simple"],
                                                           "max_receptacles": 3, "distractors": 0, "size": 20})])
def test_each_family_demonstrates_with_its_own_expert(family, options):
    demos = generate_demonstrations(family, range(10, 20), options)
    assert [d.index for d in demos] == list(range(10, 20))
    assert all(d.success and d.task == family and d.messages[-1]["role"] in ("assistant", "tool") for d in demos)


def test_a_family_without_an_expert_is_named():
    with pytest.raises(KeyError, match="'os' has no scripted expert"):
        generate_demonstrations("os", range(2))
