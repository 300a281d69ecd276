"""The ``os`` task's sessions driven directly (no controller): scoring, limits, init/start, hostile commands."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

docker = pytest.importorskip("docker")

from env_adapters.protocol import SampleStatus  # noqa: E402
from env_adapters.task import EnvironmentLost, InvalidAction  # noqa: E402
from env_adapters.tasks.os_interaction import OSTask  # noqa: E402
from env_adapters.tasks.os_interaction.oracle import tool_call_message  # noqa: E402

# One task (its pool, its threads) for the whole module, so one event loop for the whole module too.
pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.asyncio(loop_scope="module")]

TIMEOUT_S = 3.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def task():
    try:
        docker.from_env().ping()
    except docker.errors.DockerException as e:
        pytest.skip(f"no Docker daemon: {e}")
    task = OSTask(split="dev", pool_size=2, command_timeout=TIMEOUT_S, max_rounds=4, reap_interval=0)
    await task.setup()
    yield task
    await task.teardown()
    assert not task.client.containers.list(all=True, filters={"label": f"agentrl.owner={task.pool.owner}"})


@pytest_asyncio.fixture(loop_scope="module")
async def open_session(task):
    """``await open_session(index)``: a reset session, closed after the test."""
    sessions = []

    async def open_(index, custom_task=None):
        session = await task.start_session(index, custom_task)
        sessions.append(session)
        await session.reset()
        return session

    yield open_
    for session in sessions:
        await session.close()


async def bash(session, script):
    result = await session.step(tool_call_message("bash_action", script=script))
    return result, (result.messages[0]["content"] if result.messages else "")


async def test_reset_runs_init_and_start_and_offers_the_three_tools(task, open_session):
    session = await open_session(0)  # start: writes "succeed" to /root/log every second
    _, out = await bash(session, "sleep 1.5; cat /root/log; ls -a /home")
    assert "succeed" in out
    session = await open_session(6)  # init: hidden files in /home
    result, out = await bash(session, "ls -a /home | grep -c '^\\.[a-z]'")
    assert out.strip() == "6" and result.status is SampleStatus.RUNNING
    fresh = await task.start_session(1)
    try:
        opening = await fresh.reset()
    finally:
        await fresh.close()
    assert [t["function"]["name"] for t in opening.tools] == ["bash_action", "answer_action", "finish_action"]


async def test_wrong_answers_earn_zero(open_session):
    for index, answer in [(0, "2"), (13, "12345"), (8, "1T")]:  # match, integer-match, size-match
        session = await open_session(index)
        result = await session.step(tool_call_message("answer_action", answer=answer))
        assert (result.status, result.reward) == (SampleStatus.COMPLETED, 0.0)
    session = await open_session(3)  # calc item: finishing without creating `calc` fails the check script
    result = await session.step(tool_call_message("finish_action", thought="nothing done"))
    assert (result.status, result.reward) == (SampleStatus.COMPLETED, 0.0)


async def test_custom_task_and_round_limit(open_session):
    custom = {"description": "say hi", "create": {"init": "echo hi > /root/x"},
              "evaluation": {"check": [None, {"language": "python", "file": "check/string-match.py"}],
                             "example": "cat /root/x"}}
    session = await open_session(-1, custom)
    for _ in range(3):
        result, out = await bash(session, "cat /root/x")
        assert (out, result.status) == ("hi\n", SampleStatus.RUNNING)
    result, _ = await bash(session, "true")
    assert result.status is SampleStatus.TASK_LIMIT_REACHED and result.reward == 0.0
    session = await open_session(-1, custom)
    result = await session.step(tool_call_message("answer_action", answer=" hi "))
    assert (result.status, result.reward) == (SampleStatus.COMPLETED, 1.0)


async def test_messages_without_a_valid_tool_call_are_invalid_actions(open_session):
    session = await open_session(13)
    with pytest.raises(InvalidAction, match="no tool call"):
        await session.step({"role": "assistant", "content": "nproc"})
    with pytest.raises(InvalidAction, match="unknown tool"):
        await session.step(tool_call_message("python_action", code="1"))


async def test_endless_output_and_timeouts_are_cut_and_reported(open_session):
    session = await open_session(13)
    result, out = await bash(session, "cd /tmp; yes")
    assert len(out) < 1000 and "truncated" in out and "too much output" in out
    assert result.status is SampleStatus.RUNNING
    result, out = await bash(session, "sleep 60")
    assert "longer than 3 s" in out and result.metrics["timeouts"] == 1
    _, out = await bash(session, "pwd")
    assert out == "/tmp\n"


async def test_a_command_timing_out_in_a_paused_container_is_the_environments_loss(task):
    # A frozen host: the session's container is paused (`docker pause`) before a command it will never answer. The
    # command times out as an agent's too-long one would, and the container's state makes it the environment's loss;
    # unpaused, the container goes with the session (the module's fixture checks that none is left).
    session = await task.start_session(13)
    await session.reset()
    try:
        await asyncio.to_thread(session.container.pause)
    except docker.errors.APIError as error:  # the daemon has no cgroup freezer ("unable to freeze")
        await session.close()
        pytest.skip(f"this Docker daemon cannot pause a container: {error}")
    try:
        with pytest.raises(EnvironmentLost, match="is paused"):
            await bash(session, "echo answered")
    finally:
        await asyncio.to_thread(session.container.unpause)
        await session.close()


async def test_hostile_commands_stay_inside_their_session(task, open_session):
    bystander = await open_session(13)
    bomb = await open_session(13)
    wrecked = await open_session(13)

    async def bystander_works():
        for _ in range(5):
            _, out = await bash(bystander, "echo ok; nproc")
            assert out.startswith("ok\n")
            await asyncio.sleep(0.5)

    async def fork_bomb():
        result, out = await bash(bomb, ":(){ :|:& };:")
        for _ in range(4):
            if result.status.finished:
                break
            result, out = await bash(bomb, "sleep 1; ls /")
        # Either the bomb's orphans kept the container at its pids limit and the session ended with a clear
        # status, or the kill caught the whole bomb (or it died out) and the shell answers normally again.
        if result.status.finished:
            assert result.status is SampleStatus.AGENT_INVALID_ACTION and result.metrics["sandbox_broken"] == 1
            assert "stopped responding" in out
        else:
            assert out.startswith("bin\n") and "usr" in out, out

    async def rm_rf():
        result, out = await bash(wrecked, "rm -rf --no-preserve-root / >/dev/null 2>&1")
        if not result.status.finished:
            result, out = await bash(wrecked, "ls /")
        if not result.status.finished:  # bash lives on in memory; the programs it would run are gone
            assert "not found" in out or "No such file" in out, out
            result = await wrecked.step(tool_call_message("answer_action", answer="2"))
        assert result.reward == 0.0 and result.status in (SampleStatus.COMPLETED, SampleStatus.AGENT_INVALID_ACTION)

    await asyncio.gather(bystander_works(), fork_bomb(), rm_rf())
    containers = [s.container.name for s in (bomb, wrecked)]
    for session in (bomb, wrecked):
        await session.close()
        session.container, session.shell = None, None  # closed here already
    await task.pool.removals()
    for name in containers:
        with pytest.raises(docker.errors.NotFound):
            task.client.containers.get(name)
