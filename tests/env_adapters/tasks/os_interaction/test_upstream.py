"""The ``os`` task's container session matches upstream AgentBench's: each test plays a small item written in
upstream's format (as a ``custom_task``) whose outcome upstream's session decides."""

from __future__ import annotations

import pytest
import pytest_asyncio

docker = pytest.importorskip("docker")

from env_adapters.protocol import SampleStatus  # noqa: E402
from env_adapters.task import InvalidAction  # noqa: E402
from env_adapters.tasks.os_interaction import OSTask  # noqa: E402
from env_adapters.tasks.os_interaction.oracle import tool_call_message  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.asyncio(loop_scope="module")]

DISK = "48m"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def task():
    try:
        docker.from_env().ping()
    except docker.errors.DockerException as e:
        pytest.skip(f"no Docker daemon: {e}")
    task = OSTask(split="dev", pool_size=1, command_timeout=3.0, max_rounds=6, reap_interval=0, disk=DISK)
    await task.setup()
    yield task
    await task.teardown()
    assert not task.client.containers.list(all=True, filters={"label": f"agentrl.owner={task.pool.owner}"})


@pytest_asyncio.fixture(loop_scope="module")
async def play(task):
    """``await play(item)``: a session of the upstream-format ``item`` and its reset result; closed afterwards."""
    sessions = []

    async def play_(item):
        session = await task.start_session(-1, {"description": "test item", **item})
        sessions.append(session)
        return session, await session.reset()

    yield play_
    for session in sessions:
        await session.close()


async def bash(session, script):
    result = await session.step(tool_call_message("bash_action", script=script))
    return result, result.messages[0]["content"]


async def test_init_writes_for_the_shell_take_effect_when_sourced_not_at_login(play):
    # Upstream's login shell exists before the init runs: the new line applies once, when the agent sources.
    session, _ = await play({"create": {"init": "echo 'export N=$((N+1))' >> ~/.bashrc"},
                             "evaluation": {"match": "1"}})
    _, out = await bash(session, 'echo "login:${N:-unset}"')
    assert out == "login:unset\n"
    _, out = await bash(session, 'source ~/.bashrc; echo "sourced:$N"')
    assert out == "sourced:1\n"


async def test_start_runs_in_the_agents_own_shell(play):
    start = "export GREETING=hello; cd /tmp\nsu nobody -s /bin/bash"
    session, _ = await play({"start": start, "evaluation": {"match": "x"}})
    _, out = await bash(session, 'echo "$GREETING $(pwd) $(whoami)"')
    assert out == "hello /tmp nobody\n"
    # The agent's commands run in the shell `su` started: a runaway one is still stopped, the shell stays.
    _, out = await bash(session, "sleep 60")
    assert "longer than 3 s" in out
    _, out = await bash(session, "whoami")
    assert out == "nobody\n"


async def test_shell_inits_and_checks_work_in_root(play):
    session, _ = await play({"create": {"init": "echo made > relative.txt"},
                             "evaluation": {"check": {"code": '[ "$(pwd)" = /root ] && [ -f relative.txt ]'}}})
    _, out = await bash(session, "pwd; cat /root/relative.txt")
    assert out == "/root\nmade\n"
    result = await session.step(tool_call_message("finish_action", thought="nothing to do"))
    assert (result.status, result.reward, result.metrics["score"]) == (SampleStatus.COMPLETED, 1.0, 1.0)


async def test_images_hold_upstreams_packages_and_nothing_an_item_could_ask_for(play):
    session, _ = await play({"evaluation": {"check": {"code": "command -v sudo"}}})
    _, out = await bash(session, "for c in python3 pip3 git vim curl wget unzip zip tree gcc make ps; do "
                                 "command -v $c >/dev/null || echo missing $c; done; echo checked")
    assert out == "checked\n"
    _, out = await bash(session, "for c in sudo bc gawk file killall; do command -v $c || echo absent $c; done")
    assert out == "absent sudo\nabsent bc\nabsent gawk\nabsent file\nabsent killall\n"
    # "Install sudo": doing nothing does not pass.
    result = await session.step(tool_call_message("finish_action", thought="done"))
    assert (result.status, result.reward, result.metrics["score"]) == (SampleStatus.COMPLETED, 0.0, 0.0)


async def test_a_failing_init_is_a_task_error_with_its_reason(play):
    _, start = await play({"create": {"init": ["true", "echo broken >&2; exit 3"]}, "evaluation": {"match": "1"}})
    assert start.status is SampleStatus.TASK_ERROR and not start.messages
    assert start.metrics["init_error"] == "init script 1 exited with 3: broken"


async def test_open_file_limit_is_the_daemons_unless_set(play, task):
    session, _ = await play({"evaluation": {"match": "1"}})
    _, out = await bash(session, "ulimit -Sn; ulimit -Hn")
    plain = task.client.containers.run(await task.image("default"), ["bash", "-c", "ulimit -Sn; ulimit -Hn"],
                                       remove=True, network_mode="none")
    assert out == plain.decode()
    assert out == plain.decode()


async def test_a_write_past_the_disk_limit_fails_and_the_sessions_go_on(play, task, monkeypatch):
    session, _ = await play({"evaluation": {"match": "1"}})
    if not task.pool.disk_bounded:
        pytest.skip("this Docker daemon cannot bound a container's writable space (scripts/setup.sh starts one "
                    "that can): the fallback is tested instead")
    other, _ = await play({"evaluation": {"match": "1"}})
    # Writing up to the limit takes more than the module's 3 s on a busy machine: the limit, not the clock, ends it.
    monkeypatch.setattr(task, "command_timeout", 300.0)
    # 5 GiB asked for: the write fails at the limit, the agent sees why, and the session goes on.
    result, out = await bash(session, "dd if=/dev/zero of=/root/big bs=1M count=5120 2>&1; "
                                      "echo status=${PIPESTATUS[0]}; du -m /root/big")
    assert result.status is SampleStatus.RUNNING and "status=1" in out, out
    assert "Disk quota exceeded" in out or "No space left on device" in out
    assert 40 <= int(out.split()[-2]) <= 48  # MiB (DISK): the file took the space, and nothing more was written
    _, out = await bash(other, "head -c 8M /dev/zero > /root/mine && echo written")
    assert out == "written\n"  # the other session's space is its own
    _, out = await bash(session, "rm /root/big; sync; echo 1 > /root/n && cat /root/n")
    assert out == "1\n"
    result = await session.step(tool_call_message("answer_action", answer="1"))
    assert (result.status, result.reward) == (SampleStatus.COMPLETED, 1.0)


async def test_without_the_daemons_bound_writing_past_the_disk_limit_fails(play, task):
    session, _ = await play({"evaluation": {"match": "1"}})
    if task.pool.disk_bounded:
        pytest.skip("this Docker daemon bounds a container's writable space: the fallback is not used")
    result, out = await bash(session, "dd if=/dev/zero of=/root/big bs=1M count=64 2>&1; echo status=$?; "
                                      "du -m /root/big")
    assert "status=153" in out and "File size limit exceeded" in out  # SIGXFSZ: stopped at the limit
    assert out.rstrip().endswith("48\t/root/big") and result.status is SampleStatus.RUNNING
    # Past the limit in several files: the session ends after that command.
    result, out = await bash(session, "for i in 1 2; do head -c 30M /dev/zero > /root/f$i; done; echo written")
    assert result.status is SampleStatus.AGENT_INVALID_ACTION and result.metrics["disk_exceeded"] == 1
    assert "written" in out and f"disk limit ({DISK})" in out


async def test_endless_reference_output_is_cut_and_fails_quickly(play):
    session, _ = await play({"evaluation": {"check": [None, {"language": "python", "code": "import sys"}],
                                            "example": "yes"}})
    result = await session.step(tool_call_message("answer_action", answer="y"))
    assert (result.status, result.reward) == (SampleStatus.COMPLETED, 0.0)


async def test_lone_surrogates_do_not_crash_the_shell_or_the_checks(play):
    session, _ = await play({"evaluation": {"check": {"code": '[ "$1" = "ab" ]'}}})
    # A surrogate has no UTF-8 form: the tool call is the agent's invalid action (the worker's status), and the
    # shell and the check chain go on unharmed.
    for name, arguments in (("bash_action", {"script": "echo 'a\ud800b'"}), ("answer_action", {"answer": "a\ud800b"})):
        with pytest.raises(InvalidAction, match="not valid Unicode"):
            await session.step(tool_call_message(name, **arguments))
    _, out = await bash(session, "echo ab")
    assert out == "ab\n"
    result = await session.step(tool_call_message("answer_action", answer="ab"))
    assert (result.status, result.reward) == (SampleStatus.COMPLETED, 1.0)


async def test_packages_and_ubuntu_flavours(play, task):
    from env_adapters.sandbox.images import IMAGES, image_exists

    if not image_exists(task.client, IMAGES["os-packages"]):
        pytest.skip("os-packages is not built (agentrl-env build-images os-packages; about 10 minutes)")
    session, _ = await play({"create": {"local": "packages"}, "evaluation": {"match": "1"}})
    _, out = await bash(session, "command -v npm node >/dev/null && echo installed; pwd")
    assert out == "installed\n/root\n"
    session, _ = await play({"create": {"local": "ubuntu"}, "evaluation": {"match": "1"}})
    _, out = await bash(session, "cat /file.txt; command -v python3 || echo no python")
    assert out == "tmp\nno python\n"
