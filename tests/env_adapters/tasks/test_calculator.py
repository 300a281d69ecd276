import json

import pytest

from env_adapters.protocol import SampleStatus
from env_adapters.task import InvalidAction, TaskError, get_task_class
from env_adapters.tasks.calculator import CalculatorTask, Problem, evaluate, step_latency_sampler


def call(name, **args):
    return {"id": f"c-{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def msg(*calls):
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


@pytest.mark.parametrize(("expression", "value"), [
    ("37+48", 85), (" 37 + 48 ", 85), ("90-12", 78), ("-5+3", -2), ("37 - -5", 42), ("1+2-3+4", 4), ("7", 7),
])
def test_evaluate(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", ["", "3*4", "2+", "__import__('os')", "1 2", "3+(4)", "9" * 300])
def test_evaluate_rejects(expression):
    with pytest.raises(ValueError):
        evaluate(expression)


def test_registered_and_deterministic():
    assert get_task_class("calc") is CalculatorTask
    p1, text1 = Problem.from_index(0, 5)
    p2, text2 = Problem.from_index(0, 5)
    assert (p1, text1) == (p2, text2)
    assert 10 <= p1.a <= 99 and 10 <= p1.b <= 99 and p1.op in "+-"
    assert str(p1.a) in text1 and str(p1.b) in text1
    problems = {Problem.from_index(0, i)[0] for i in range(50)}
    assert len(problems) > 40 and {p.op for p in problems} == {"+", "-"}
    assert len({Problem.from_index(0, i)[1].split(" ")[0] for i in range(50)}) >= 3  # several phrasings
    assert Problem.from_index(1, 5) != Problem.from_index(0, 5)


async def start(task, index=0, custom=None):
    session = await task.start_session(index, custom)
    return session, await session.reset()


async def test_solved_episode_gets_reward():
    task = CalculatorTask(size=10)
    assert task.indices() == list(range(10))
    session, opening = await start(task, -1, {"a": 37, "b": 48, "op": "+"})
    assert opening.messages == [{"role": "user", "content": "What is 37 plus 48?"}]
    assert [t["function"]["name"] for t in opening.tools] == ["calculate", "submit"]
    r = await session.step(msg(call("calculate", expression="37+48")))
    assert r.status is SampleStatus.RUNNING and r.messages[0]["content"] == "85"
    assert r.messages[0]["tool_call_id"] == "c-calculate"
    r = await session.step(msg(call("submit", answer=" 85 ")))
    assert (r.status, r.reward, r.metrics) == (SampleStatus.COMPLETED, 1.0, {"rounds": 2, "calculate_calls": 1})


async def test_submit_without_calculate_or_wrong_answer_gets_zero():
    task = CalculatorTask()
    session, _ = await start(task, -1, {"a": 50, "b": 20, "op": "-"})
    r = await session.step(msg(call("submit", answer="30")))
    assert (r.status, r.reward) == (SampleStatus.COMPLETED, 0.0)
    session, _ = await start(task, -1, {"a": 50, "b": 20, "op": "-"})
    await session.step(msg(call("calculate", expression="50-20")))
    r = await session.step(msg(call("submit", answer="31")))
    assert (r.status, r.reward) == (SampleStatus.COMPLETED, 0.0)


async def test_bad_expression_is_a_tool_error_not_the_end():
    session, _ = await start(CalculatorTask())
    r = await session.step(msg(call("calculate", expression="6*7")))
    assert r.status is SampleStatus.RUNNING and r.messages[0]["content"].startswith("error:")


async def test_invalid_messages_raise_invalid_action():
    session, _ = await start(CalculatorTask())
    with pytest.raises(InvalidAction):
        await session.step({"role": "assistant", "content": "85"})
    bad_json = {"id": "x", "type": "function", "function": {"name": "submit", "arguments": "{not json"}}
    with pytest.raises(InvalidAction):
        await session.step(msg(bad_json))
    with pytest.raises(InvalidAction):
        await session.step(msg(call("multiply", x=1)))


async def test_round_limit():
    session, _ = await start(CalculatorTask(max_rounds=2))
    assert (await session.step(msg(call("calculate", expression="1+1")))).status is SampleStatus.RUNNING
    r = await session.step(msg(call("calculate", expression="1+1")))
    assert r.status is SampleStatus.TASK_LIMIT_REACHED and r.metrics["rounds"] == 2


async def test_bad_index_and_custom_task():
    task = CalculatorTask(size=3)
    for index, custom in [(3, None), (-1, None), (-1, {"a": 1}), (-1, {"a": 1, "b": 2, "op": "*"})]:
        with pytest.raises(TaskError):
            await task.start_session(index, custom)


def test_step_latency():
    import random

    assert step_latency_sampler(None, random.Random(0))() == 0.0
    assert step_latency_sampler({"dist": "fixed", "s": 0.1}, random.Random(0))() == 0.1
    sample = step_latency_sampler({"dist": "lognormal", "median_s": 0.05, "sigma": 1.5, "max_s": 5}, random.Random(0))
    draws = sorted(sample() for _ in range(2001))
    assert 0.03 < draws[1000] < 0.08 and max(draws) <= 5
    for bad in [{"dist": "uniform"}, {"dist": "fixed"}, {"dist": "fixed", "s": 1, "extra": 2}]:
        with pytest.raises(ValueError, match="step_latency"):
            CalculatorTask(step_latency=bad)
