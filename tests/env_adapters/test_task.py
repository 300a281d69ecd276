"""The task API's helpers: tool-call parsing turns every malformed call into the model's InvalidAction; a
ToolSession runs a message's calls through its tool methods."""

import pytest

from env_adapters.protocol import SampleStatus
from env_adapters.task import InvalidAction, StepResult, ToolSession, function_tool, parse_tool_calls

TOOLS = [function_tool("run", "Run a script", {"script": {"type": "string"}}),
         function_tool("stop", "Stop", {}, required=[])]


def call(name="run", arguments='{"script": "ls"}', **extra):
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}, **extra}


def test_valid_calls_parse():
    message = {"role": "assistant", "content": "", "tool_calls": [
        call(), {"function": {"name": "stop"}}, call(arguments={"script": "pwd"}, id="c3")]}
    calls = parse_tool_calls(message, TOOLS)
    assert [(c.id, c.name, c.arguments) for c in calls] == [("c1", "run", {"script": "ls"}), ("call_1", "stop", {}),
                                                           ("c3", "run", {"script": "pwd"})]
    assert parse_tool_calls({"role": "assistant", "content": "hi"}, TOOLS) == []


MALFORMED = {
    "tool_calls is a string": ("run", "list of calls"),
    "tool_calls is an object": ({"function": {"name": "run", "arguments": "{}"}}, "list of calls"),
    "a call is a string": (["run"], "'function' object"),
    "a call is null": ([None], "'function' object"),
    "calls nested in a list": ([[call()]], "'function' object"),
    "no function": ([{"id": "c1", "name": "run", "arguments": "{}"}], "'function' object"),
    "function is a string": ([{"function": "run"}], "'function' object"),
    "function nested twice": ([{"function": {"function": {"name": "run", "arguments": "{}"}}}], "unknown tool None"),
    "name is a list": ([call(name=["run"])], "unknown tool ['run']"),
    "name is an object": ([call(name={"n": "run"})], "unknown tool"),
    "unknown name": ([call(name="rm")], "unknown tool 'rm'"),
    "arguments a number": ([call(arguments=5)], "must be a JSON object, got int"),
    "arguments a list": ([call(arguments=[])], "must be a JSON object, got list"),
    "arguments false": ([call(arguments=False)], "must be a JSON object, got bool"),
    "arguments JSON text of a string": ([call(arguments='"ls"')], "must be a JSON object, got str"),
    "arguments not JSON": ([call(arguments="{script: ls")], "not valid JSON"),
    "required argument missing": ([call(arguments='{"cmd": "ls"}')], "missing required argument(s) ['script']"),
    "lone surrogate in an argument": ([call(arguments='{"script": "echo \\ud800"}')], "not valid Unicode"),
    "lone surrogate in a key": ([call(arguments='{"script": "ls", "\\udfff": 1}')], "not valid Unicode"),
    "id not a string": ([call(id=5)], "'id' must be a string"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_calls_are_invalid_actions(case):
    tool_calls, text = MALFORMED[case]
    with pytest.raises(InvalidAction) as e:
        parse_tool_calls({"role": "assistant", "content": "", "tool_calls": tool_calls}, TOOLS)
    assert text in str(e.value)


class Shell(ToolSession):
    """``run`` echoes its script; ``stop`` ends the episode with reward 1."""

    tools, no_call_hint, max_rounds = TOOLS, "call run or stop", 2

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def reset(self) -> StepResult:
        return StepResult(tools=TOOLS)

    async def tool_run(self, call) -> str:
        self.ran.append(call.arguments["script"])
        return f"ran {call.arguments['script']}"

    async def tool_stop(self, call) -> StepResult:
        return StepResult([{"role": "user", "content": "bye"}], SampleStatus.COMPLETED, 1.0, self.step_metrics())


def message(*calls):
    return {"role": "assistant", "content": "", "tool_calls": list(calls)}


async def test_a_tool_session_runs_calls_in_order_and_a_terminal_call_ends_the_step():
    session = Shell()
    result = await session.step(message(call(), call(arguments={"script": "pwd"}, id="c2"), call("stop", "{}"),
                                        call(arguments={"script": "never"}, id="c4")))
    assert session.ran == ["ls", "pwd"]  # the calls after the one that ended the episode do not run
    assert (result.status, result.reward, result.metrics) == (SampleStatus.COMPLETED, 1.0, {"rounds": 1})
    # The replies so far, each to its call, then the ending call's own messages.
    assert result.messages == [{"role": "tool", "tool_call_id": "c1", "name": "run", "content": "ran ls"},
                               {"role": "tool", "tool_call_id": "c2", "name": "run", "content": "ran pwd"},
                               {"role": "user", "content": "bye"}]


async def test_a_tool_session_refuses_a_message_without_a_call_and_ends_at_its_round_limit():
    session = Shell()
    with pytest.raises(InvalidAction, match="call run or stop"):
        await session.step({"role": "assistant", "content": "thinking"})
    with pytest.raises(InvalidAction, match="unknown tool 'rm'"):
        await session.step(message(call(name="rm")))
    session = Shell()
    first = await session.step(message(call()))
    assert (first.status, first.metrics) == (SampleStatus.RUNNING, {"rounds": 1})
    second = await session.step(message(call()))
    assert (second.status, second.reward, second.metrics) == (SampleStatus.TASK_LIMIT_REACHED, 0.0, {"rounds": 2})
