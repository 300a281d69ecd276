"""The persistent shell in a real container: state, stdin, timeouts, floods, exits, runaway loops."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("docker")

from env_adapters.sandbox.containers import ContainerPool  # noqa: E402
from env_adapters.sandbox.shell import PersistentShell  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.docker]


@pytest.fixture(scope="module")
def container(docker_client, os_image):
    pool = ContainerPool(docker_client, size=0, reap_interval=0)
    container = pool._create(os_image)
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
    assert result.seconds < 10
    assert shell.run("pwd").output == "/etc\n"


def test_endless_output_is_cut_and_killed_quickly(shell):
    t0 = time.monotonic()
    result = shell.run("yes", timeout=30, keep_bytes=1000, flood_bytes=100_000)
    assert result.flooded and result.truncated and len(result.output) == 1000
    assert time.monotonic() - t0 < 10
    assert shell.run("echo alive").output == "alive\n"


def test_exit_and_runaway_loops_get_a_fresh_shell(shell):
    shell.run("cd /usr")
    exited = shell.run("exit 3")
    assert exited.restarted and not exited.timed_out
    assert shell.run("pwd").output == "/\n"  # fresh shell, default directory
    # Killing its child does not stop a loop that keeps starting new ones: the shell is replaced.
    looped = shell.run("while true; do sleep 1; done", timeout=1, grace=1)
    assert looped.restarted and looped.timed_out
    assert shell.run("echo ok").output == "ok\n"
    # Nothing of the loop survives.
    procs = shell.run("ps -e -o args=").output.splitlines()
    assert "sleep 1" not in procs and "sleep infinity" in procs
