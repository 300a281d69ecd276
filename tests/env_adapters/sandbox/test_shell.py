"""The persistent shell in a real container: state, stdin, timeouts, floods, exits, runaway loops."""

from __future__ import annotations

import pytest

docker = pytest.importorskip("docker")

from env_adapters.sandbox.containers import ContainerPool  # noqa: E402
from env_adapters.sandbox.shell import PersistentShell, exec_bounded  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.docker]


@pytest.fixture(scope="module")
def container(docker_client, os_image):
    pool = ContainerPool(docker_client, size=0, reap_interval=0)
    container = pool._create(os_image).container
    yield container
    pool._remove(container.name)


@pytest.fixture
def shell(container):
    shell = PersistentShell(container.client.api, container.id)
    yield shell
    shell.close()


def test_state_persists_and_stderr_is_merged(shell):
    assert shell.run("cd /tmp && X=41 && f() { echo $((X + 1)); }").exit_code == 0
    result = shell.run("pwd; f; ls /nope")
    assert result.output.startswith("/tmp\n42\n") and "No such file" in result.output
    assert result.exit_code == 2
    assert shell.run("printf 'no newline'").output == "no newline"
    assert shell.run("alias hi='echo hello'").exit_code == 0 and shell.run("hi").output == "hello\n"


def test_a_command_reading_input_gets_eof_instead_of_the_next_command(shell):
    assert shell.run("cat; read line; echo read=$?").output == "read=1\n"
    assert shell.run("echo next").output == "next\n"


def test_a_forged_sentinel_does_not_end_the_command_early(shell):
    result = shell.run("echo __AGENTRL_DONE_0000000000000000 0; echo after")
    assert result.output.endswith("after\n") and result.exit_code == 0


def test_timeout_kills_the_command_but_keeps_the_shell(shell):
    shell.run("cd /etc")
    result = shell.run("sleep 60", timeout=1)
    assert result.timed_out and result.exit_code is None and not result.restarted
    assert shell.run("pwd").output == "/etc\n"


def test_endless_output_is_cut_and_killed_at_the_flood_limit(shell):
    result = shell.run("yes", timeout=30, keep_bytes=1000, flood_bytes=100_000)
    # Killed by the flood limit (flooded), not left to run to its 30 s timeout (timed_out).
    assert result.flooded and not result.timed_out and result.truncated and len(result.output) == 1000
    assert shell.run("echo alive").output == "alive\n"


def test_exit_and_runaway_loops_get_a_fresh_shell(shell):
    shell.run("cd /usr")
    exited = shell.run("exit 3")
    assert exited.restarted and not exited.timed_out
    assert shell.run("pwd").output == "/root\n"  # fresh shell, the image's working directory
    # Killing its child does not stop a loop that keeps starting new ones: the shell is replaced.
    looped = shell.run("while true; do sleep 1; done", timeout=1, grace=1)
    assert looped.restarted and looped.timed_out
    assert shell.run("echo ok").output == "ok\n"
    # Nothing of the loop survives.
    procs = shell.run("ps -e -o args=").output.splitlines()
    assert "sleep 1" not in procs and "sleep infinity" in procs


def test_raw_text_is_typed_into_the_shell_and_a_nested_shell_reads_what_follows(shell):
    assert shell.run("export V=1; cd /tmp\nsu nobody -s /bin/bash", raw=True).exit_code == 0
    assert shell.run("echo $V $(pwd) $(whoami)").output == "1 /tmp nobody\n"
    assert shell.run("sleep 60", timeout=1).timed_out  # the nested shell's command is the one killed
    assert shell.run("whoami").output == "nobody\n"
    back = shell.run("exit")  # leaves the nested shell only: the login shell reads on
    assert not back.restarted and shell.run("whoami").output == "root\n"


def test_exec_bounded_keeps_a_prefix_and_stops_an_endless_process(container):
    api = container.client.api
    done = exec_bounded(api, container.id, ["bash", "-c", "echo out; echo err >&2; exit 3"], keep_bytes=100,
                        timeout=30)
    # stdout and stderr both kept (their order across the two streams is Docker's, as for upstream's exec_run)
    assert (done.exit_code, sorted(done.output.splitlines()), done.truncated) == (3, [b"err", b"out"], False)
    flood = exec_bounded(api, container.id, ["bash", "-c", "yes | cat"], keep_bytes=5000, timeout=60)
    assert flood.truncated and flood.exit_code is None and flood.output == b"y\n" * 2500
    _, procs = container.exec_run(["ps", "-e", "-o", "comm="])
    assert b"yes" not in procs.split() and b"cat" not in procs.split()  # the whole group was killed
    # stderr that overtakes stdout (Docker forwards the two independently) is kept, in arrival order.
    for _ in range(5):
        mixed = exec_bounded(api, container.id, ["bash", "-c", "head -c 100000 /dev/zero | tr '\\0' e >&2; echo out"],
                             keep_bytes=200_000, timeout=30)
        assert (mixed.exit_code, len(mixed.output), mixed.output.count(b"out\n")) == (0, 100_004, 1)
    slow = exec_bounded(api, container.id, ["sleep", "30"], keep_bytes=100, timeout=0.5)
    assert slow.exit_code == 124  # GNU timeout's status


def test_exec_bounded_reports_a_process_that_cannot_start(docker_client, os_image):
    pool = ContainerPool(docker_client, size=0, reap_interval=0)
    wrecked = pool._create(os_image).container
    try:
        wrecked.exec_run(["rm", "-rf", "/root"])  # the working directory of every exec (upstream's /root)
        with pytest.raises(docker.errors.APIError, match="cannot start a process"):
            exec_bounded(wrecked.client.api, wrecked.id, ["true"], keep_bytes=100, timeout=5)
    finally:
        pool._remove(wrecked.name)
