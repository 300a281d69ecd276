"""The stack's tasks as an OpenEnv environment, driven by OpenEnv's own client (``GenericEnvClient``, simulation mode):
a stack YAML's ``openenv`` entry starts the server; each family's scripted expert earns through it what it earns on
the native path."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
from openenv.core.generic_client import GenericEnvClient

from env_adapters.client import EnvClient
from env_adapters.launcher import EnvStack
from env_adapters.openenv_serve import MessageAction
from env_adapters.protocol import Index, Message
from env_adapters.sandbox.containers import LABEL_SANDBOX
from env_adapters.task import Task, assistant_tool_call, get_task_class

pytestmark = pytest.mark.slow  # a stack and an OpenEnv server (its imports: gradio, fastmcp)

TOKEN = "openenv-test-token"
MAX_TURNS = 12  # a guard: every expert here finishes in fewer
STARTUP_TIMEOUT_S = 180  # openenv imports gradio and fastmcp: 10-45 s on the 2-core machine


# Every family with a scripted expert (os has none), at the options the demos train on.
FAMILIES = {
    "calc": {"seed": 0, "size": 64},
    "db": {"backend": "sqlite"},
    "kg": {"preset": "easy", "prompt": "short", "size": 200},
    "webshop": {"preset": "easy", "prompt": "short", "page_size": 3},
    "alfworld": {"task_types": ["pick_and_place_simple"], "max_receptacles": 3, "distractors": 0, "prompt": "short"},
}


@pytest.fixture(scope="module")
def stack():
    """One stack of every family, with its OpenEnv server."""
    config = {"controller": {"port": 0, "token": TOKEN}, "openenv": {"port": 0},
              "workers": [{"task": family, "concurrency": 4, "options": options}
                          for family, options in FAMILIES.items()]}
    with EnvStack(config, startup_timeout=STARTUP_TIMEOUT_S) as env:
        yield env


def openenv_client(stack: EnvStack, token: str = TOKEN) -> GenericEnvClient:
    return GenericEnvClient(base_url=stack.openenv_url, headers={"Authorization": f"Bearer {token}"},
                            message_timeout_s=60)


def openenv_action(message: Message) -> CallToolAction | MessageAction:
    """The expert's assistant message as OpenEnv's action: its one function call, or its text."""
    if not message.get("tool_calls"):
        return MessageAction(content=message["content"])
    (call,) = message["tool_calls"]
    return CallToolAction(tool_name=call["function"]["name"], arguments=json.loads(call["function"]["arguments"]))


async def play_openenv(url: str, task: str, expert: Task, index: Index) -> tuple[float, str, int]:
    """The expert through OpenEnv: (reward, status, turns)."""
    async with GenericEnvClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"},
                                message_timeout_s=60) as env:
        result = await env.reset(task=task, index=index)
        messages, turns = list(result.observation["messages"]), 0
        while not result.done and turns < MAX_TURNS:
            action = expert.expert(index, messages)
            result = await env.step(openenv_action(action))
            messages += [action, *result.observation["metadata"]["messages"]]
            turns += 1
        return result.reward, result.observation["metadata"]["status"], turns


async def play_native(url: str, task: str, expert: Task, index: Index) -> tuple[float, str, int]:
    """The expert through the controller's own client: (reward, status, turns)."""
    async with EnvClient(url, token=TOKEN) as client:
        started = await client.start_sample(task, index)
        messages, turns, finished = list(started.messages), 0, False
        while not finished and turns < MAX_TURNS:
            action = expert.expert(index, messages)
            reply = await client.interact(started.session_id, action)
            messages += [action, *reply.messages]
            turns, finished = turns + 1, reply.finish
        return reply.reward, reply.status.value, turns


@pytest.mark.parametrize("family", FAMILIES)
async def test_each_familys_expert_earns_through_openenv_what_it_earns_natively(stack, family):
    expert = get_task_class(family)(**FAMILIES[family])
    await expert.setup()
    try:
        async with EnvClient(stack.url, token=TOKEN) as client:
            indices = (await client.get_indices(family))[:2]
        played = [(await play_openenv(stack.openenv_url, family, expert, i),
                   await play_native(stack.url, family, expert, i)) for i in indices]
    finally:
        await expert.teardown()
    assert len(played) == 2
    for through_openenv, native in played:
        assert through_openenv == native and through_openenv[:2] == (1.0, "completed"), played


async def test_reset_lists_the_tools_and_a_bad_call_is_answered_as_the_family_answers_it(stack):
    async with openenv_client(stack) as env:
        with pytest.raises(RuntimeError, match=r"name the task to reset: reset\(task=\.\.\.\), one of \['alfworld'"):
            await env.reset(seed=5)  # several tasks in the stack
        opening = await env.reset(task="calc", seed=5)  # the seed picks the index
        assert opening.observation["task"] == "calc" and not opening.done
        listed = await env.step(ListToolsAction())
        names = [tool["name"] for tool in listed.observation["tools"]]
        assert names == [tool["function"]["name"] for tool in opening.observation["tools"]]
        bad = await env.step(CallToolAction(tool_name="calculate", arguments={"expression": "2**100"}))
    async with EnvClient(stack.url, token=TOKEN) as client:
        started = await client.start_sample("calc", opening.observation["index"])
        native = await client.interact(started.session_id, assistant_tool_call("calculate", {"expression": "2**100"}))
        await client.cancel(started.session_id)
    assert not bad.done and bad.observation["result"] == native.messages[0]["content"]
    assert bad.observation["metadata"]["status"] == native.status.value == "running"


async def test_the_end_of_an_openenv_session_cancels_its_controller_session(stack):
    async with openenv_client(stack) as env:
        await env.reset(task="calc", index=7)
        assert [s["status"] for s in stack._get("list_sessions").values() if s["status"] == "running"]
    deadline = time.monotonic() + 30
    while any(s["status"] == "running" for s in stack._get("list_sessions").values()):
        assert time.monotonic() < deadline, stack._get("list_sessions")
        await asyncio.sleep(0.1)


async def test_a_client_without_the_stacks_token_is_refused(stack):
    with pytest.raises(ConnectionError, match="rejected WebSocket connection: HTTP 403"):
        async with openenv_client(stack, token="wrong") as env:
            await env.reset(task="calc", index=0)
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(f"{stack.openenv_url}/health", timeout=10)


# A trainer's process that resets a session, makes one call (whose result names what the session holds) and then
# hangs, never closing its OpenEnv session: the test kills it mid-episode.
HANGING_CLIENT = """
import asyncio, json, sys
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.generic_client import GenericEnvClient

async def main(url, token, task, index, tool, arguments):
    env = GenericEnvClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, message_timeout_s=60)
    await env.reset(task=task, index=int(index))
    result = await env.step(CallToolAction(tool_name=tool, arguments=json.loads(arguments)))
    print(json.dumps(result.observation["result"]), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(*sys.argv[1:]))
"""


def wait_released(still_held: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while still_held():
        assert time.monotonic() < deadline, f"{what} still held after {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.docker
@pytest.mark.mysql
def test_a_client_killed_mid_episode_leaves_no_container_and_no_database(docker_client, mariadb_url,
                                                                          mariadb_sessions):
    config = {"controller": {"port": 0, "token": TOKEN}, "openenv": {"port": 0}, "workers": [
        {"task": "os", "concurrency": 2, "options": {"split": "dev", "pool_size": 1}},
        {"task": "db", "concurrency": 2, "options": {"backend": "mysql", "mysql_url": mariadb_url}}]}

    def containers(**filters) -> list[dict]:
        return docker_client.api.containers(all=True, filters={"label": LABEL_SANDBOX, **filters})

    def held_container(hostname: str) -> bool:  # Docker sets the container's short id as its hostname
        return bool(containers(id=hostname.strip()))

    def held_database(result: str) -> bool:  # "[('agentrl_...',)]"
        return any(name in result for name in mariadb_sessions()[0])

    with EnvStack(config, startup_timeout=STARTUP_TIMEOUT_S) as stack:
        for task, index, tool, arguments, holds in [
                ("os", 13, "bash_action", {"script": "hostname"}, held_container),
                ("db", 3, "execute_sql", {"query": "SELECT DATABASE()"}, held_database)]:
            client = subprocess.Popen([sys.executable, "-c", HANGING_CLIENT, stack.openenv_url, TOKEN, task,
                                       str(index), tool, json.dumps(arguments)], stdout=subprocess.PIPE, text=True)
            try:
                result = json.loads(client.stdout.readline())
                assert holds(result), (task, result)
            finally:
                client.kill()  # no close frame: the connection just goes
                client.wait()
            wait_released(functools.partial(holds, result), f"{result!r}, of the killed client's {task} session")
        assert not [s for s in stack._get("list_sessions").values() if s["status"] == "running"]
