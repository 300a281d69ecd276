"""The ``openenv`` family: an OpenEnv environment's server as a task of the stack. Against the echo environment that
OpenEnv's own CLI scaffolds (``openenv init``; not ours), and against this project's OpenEnv server (MCP tools): calc
through the OpenEnv path earns what it earns natively."""

from __future__ import annotations

import json

import pytest

from env_adapters.client import EnvClient
from env_adapters.launcher import EnvStack
from env_adapters.protocol import SampleStatus
from env_adapters.task import TaskError, assistant_tool_call, get_task_class

TOKEN = "openenv-remote-test-token"
STARTUP_TIMEOUT_S = 180  # openenv imports gradio and fastmcp: 10-45 s on the 2-core machine


def test_bad_options_are_refused_naming_them(monkeypatch):
    family = get_task_class("openenv")
    with pytest.raises(ValueError, match="interface 'json': use 'action' or 'mcp'"):
        family(url="http://127.0.0.1:1", interface="json")
    with pytest.raises(ValueError, match=r"size \(0\) and max_rounds \(4\) must be at least 1"):
        family(url="http://127.0.0.1:1", size=0)
    monkeypatch.delenv("AGENTRL_TEST_UNSET", raising=False)
    with pytest.raises(ValueError, match="token_env 'AGENTRL_TEST_UNSET' names an unset or empty"):
        family(url="http://127.0.0.1:1", token_env="AGENTRL_TEST_UNSET")


async def test_a_server_that_does_not_answer_is_unhealthy_and_has_no_schema():
    task = get_task_class("openenv")(url="http://127.0.0.1:9")  # the discard port: nothing listens
    assert not await task.healthy()
    with pytest.raises(TaskError, match=r"no action schema from http://127.0.0.1:9/schema"):
        await task.setup()


@pytest.mark.slow  # a stack and a served environment (openenv imports gradio and fastmcp)
async def test_the_scaffolded_echo_environment_plays_as_a_task(echo_env_url):
    worker = {"task": "openenv", "name": "echo", "concurrency": 2,
              "options": {"url": echo_env_url, "size": 8, "max_rounds": 2, "end_at_limit": True,
                          "prompt": "Send a message."}}
    with EnvStack({"controller": {"port": 0}, "workers": [worker]}, startup_timeout=STARTUP_TIMEOUT_S) as stack:
        async with EnvClient(stack.url) as env:
            assert await env.get_indices("echo") == list(range(8))
            started = await env.start_sample("echo", 3)
            (opening,) = started.messages
            assert opening["role"] == "user" and opening["content"].startswith("Send a message.")
            assert json.loads(opening["content"].split("\n\n", 1)[1]) == {
                "echoed_message": "Echo Env environment ready!", "message_length": 0}
            (tool,) = started.tools
            assert tool["function"]["name"] == "step"
            assert tool["function"]["parameters"]["required"] == ["message"]
            first = await env.interact(started.session_id, assistant_tool_call("step", {"message": "hello"}))
            assert first.status is SampleStatus.RUNNING
            assert json.loads(first.messages[0]["content"]) == {"echoed_message": "hello", "message_length": 5}
            # The echo environment never ends an episode: end_at_limit completes it with its rewards' sum.
            last = await env.interact(started.session_id, assistant_tool_call("step", {"message": "a" * 20}))
            assert (last.status, last.reward) == (SampleStatus.COMPLETED, pytest.approx(0.5 + 1.0))

            # An action the environment's schema refuses, and a message without a call, end as the model's mistake.
            refused = await env.start_sample("echo", 4)
            reply = await env.interact(refused.session_id, assistant_tool_call("step", {"message": 5}))
            assert reply.status is SampleStatus.AGENT_INVALID_ACTION
            silent = await env.start_sample("echo", 5)
            reply = await env.interact(silent.session_id, {"role": "assistant", "content": "hello"})
            assert reply.status is SampleStatus.AGENT_INVALID_ACTION


@pytest.mark.slow  # two stacks, one with an OpenEnv server
async def test_a_family_served_over_openenv_earns_through_the_openenv_task_what_it_earns_natively(monkeypatch):
    calc = {"seed": 0, "size": 16}
    served = {"controller": {"port": 0, "token": TOKEN}, "openenv": {"port": 0},
              "workers": [{"task": "calc", "concurrency": 2, "options": calc}]}
    with EnvStack(served, startup_timeout=STARTUP_TIMEOUT_S) as server:
        monkeypatch.setenv("AGENTRL_TEST_OPENENV_TOKEN", TOKEN)
        worker = {"task": "openenv", "name": "calc_openenv", "concurrency": 2,
                  "options": {"url": server.openenv_url, "size": 16, "interface": "mcp", "max_rounds": 4,
                              "reset_kwargs": {"task": "calc"}, "token_env": "AGENTRL_TEST_OPENENV_TOKEN"}}
        with EnvStack({"controller": {"port": 0}, "workers": [worker]}, startup_timeout=STARTUP_TIMEOUT_S) as stack:
            expert = get_task_class("calc")(**calc)
            outcomes = {}
            for url, task, token in [(stack.url, "calc_openenv", None), (server.url, "calc", TOKEN)]:
                async with EnvClient(url, token=token) as env:
                    for index in (2, 9):
                        started = await env.start_sample(task, index)
                        messages = list(started.messages)
                        assert [t["function"]["name"] for t in started.tools] == ["calculate", "submit"]
                        for _ in range(4):
                            action = expert.expert(index, messages)
                            reply = await env.interact(started.session_id, action)
                            messages += [action, *reply.messages]
                            if reply.finish:
                                break
                        outcomes[task, index] = (reply.status, reply.reward, [m["content"] for m in messages])
            bad = {}
            for url, task, token in [(stack.url, "calc_openenv", None), (server.url, "calc", TOKEN)]:
                async with EnvClient(url, token=token) as env:
                    started = await env.start_sample(task, 2)
                    bad[task] = await env.interact(started.session_id,
                                                   assistant_tool_call("submit", {"answer": "not a number"}))
    for index in (2, 9):
        assert outcomes["calc_openenv", index] == outcomes["calc", index]
        assert outcomes["calc", index][:2] == (SampleStatus.COMPLETED, 1.0)
    # The family's own status for a wrong answer comes through the observation's metadata.
    assert (bad["calc_openenv"].status, bad["calc_openenv"].reward) == (bad["calc"].status, bad["calc"].reward)
