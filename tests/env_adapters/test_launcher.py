"""The stack as real processes: `EnvStack`, `agentrl-env up`, and a worker killed mid-session."""

import json
import os
import signal
import subprocess
import sys
import time
from importlib import resources

import psutil
import pytest

from env_adapters.client import EnvClient, EnvRequestError
from env_adapters.http import TOKEN_ENV
from env_adapters.launcher import EnvStack, StackStartError, load_config

CALL = {"id": "c1", "type": "function",
        "function": {"name": "calculate", "arguments": json.dumps({"expression": "1+1"})}}
STEP = {"role": "assistant", "content": "", "tool_calls": [CALL]}


def test_example_configs_are_valid():
    names = [p.name for p in resources.files("env_adapters.configs").iterdir() if p.name.endswith(".yaml")]
    assert "calc.yaml" in names
    for name in names:
        load_config(str(resources.files("env_adapters.configs") / name))


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="replicaz"):
        load_config({"workers": [{"task": "calc", "replicaz": 2}]})
    with pytest.raises(ValueError, match="idle_timeout"):
        load_config({"controller": {"idle_timeout": 3}})
    with pytest.raises(ValueError, match="threads"):
        load_config({"workers": [{"task": "calc", "threads": 0}]})
    assert load_config({"workers": [{"task": "calc", "threads": 2}]}).workers[0].threads == 2


def test_environment_variables_fill_in_texts_and_an_unset_one_is_named(monkeypatch):
    monkeypatch.setenv("AGENTBENCH", "/data/AgentBench")
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    config = {"workers": [{"task": "os", "options": {"data": [{"problem_file": "${AGENTBENCH}/data/1/*.json"}],
                                                     "max_rounds": 8, "note": "$AGENTBENCH stays"}}]}
    options = load_config(config).workers[0].options
    assert options == {"data": [{"problem_file": "/data/AgentBench/data/1/*.json"}], "max_rounds": 8,
                       "note": "$AGENTBENCH stays"}  # only ${NAME} is a reference
    with pytest.raises(ValueError, match=r"workers\[0\]\.options\.catalogue uses \$\{WEBSHOP_DATA\}, which is not set"):
        load_config({"workers": [{"task": "webshop", "options": {"catalogue": "${WEBSHOP_DATA}"}}]})


@pytest.mark.slow
def test_worker_that_fails_to_start_is_named():
    config = {"controller": {"port": 0}, "workers": [{"task": "calc", "options": {"size": 0}}]}
    expected = r"(?s)worker0\.0-calc exited with code 2.*size and max_rounds must be >= 1"
    with pytest.raises(StackStartError, match=expected):
        EnvStack(config, startup_timeout=30).start()


@pytest.mark.slow
async def test_killed_worker_sessions_end_and_restart_is_used():
    config = {"controller": {"port": 0, "heartbeat_timeout": 2, "clean_interval": 0.5},
              "workers": [{"task": "calc", "replicas": 2, "concurrency": 4, "heartbeat_interval": 0.5}]}
    with EnvStack(config) as stack:
        async with EnvClient(stack.url) as env:
            a, b = await env.start_sample("calc", 0), await env.start_sample("calc", 1)
            workers = await env.list_workers()
            by_id = {s: info["worker_id"] for s, info in (await env.list_sessions()).items()}
            assert by_id[str(a.session_id)] != by_id[str(b.session_id)]  # least loaded: one each
            address = workers["calc"][str(by_id[str(a.session_id)])]["address"]
            victim = next(i for i, (label, proc) in enumerate(stack.workers)
                          if f"worker{i // 2}" in label and _serves(proc.pid, address))
            stack.kill_worker(victim)
            reply = await env.interact(a.session_id, STEP)
            assert (reply.finish, reply.status) == (True, "task error")
            # The environment's doing, not the agent's; found at once (refused), not after the interact timeout.
            assert reply.metrics["env_lost"].startswith("worker ") and "ConnectError" in reply.metrics["env_lost"]
            assert (await env.interact(b.session_id, STEP)).status == "running"
            for i in range(3):  # new sessions go to the survivor
                s = await env.start_sample("calc", i)
                assert (await env.list_sessions())[str(s.session_id)]["worker_id"] == by_id[str(b.session_id)]
            stack.restart_worker(victim)
            stack.wait_registered(2, timeout=20)
            s = await env.start_sample("calc", 9)  # the survivor has 0 free... 4 used; the new one is idle
            placed = (await env.list_sessions())[str(s.session_id)]["worker_id"]
            assert placed not in (by_id[str(a.session_id)], by_id[str(b.session_id)])
            assert (await env.interact(s.session_id, STEP)).status == "running"


def _serves(pid: int, address: str) -> bool:
    """Whether process ``pid`` listens on the port of ``address`` (via /proc, no extra dependency)."""
    port = int(address.rsplit(":", 1)[1].split("/")[0])
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if int(cols[1].split(":")[1], 16) == port and cols[3] == "0A" and cols[9] in inodes:
                return True
    return False


def _gone(pid: str) -> bool:
    return not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl_c", "killed"])
def test_up_command_takes_everything_with_it_on_ctrl_c_or_when_killed(tmp_path, how):
    config = tmp_path / "stack.yaml"
    config.write_text("controller: {port: 0}\nworkers:\n  - {task: calc, replicas: 2, concurrency: 2}\n")
    proc = subprocess.Popen([sys.executable, "-m", "env_adapters.cli", "up", str(config), "--log-dir", str(tmp_path)],
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "controller URL" in line:
                break
        assert "controller URL" in line
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 3
        proc.send_signal(how)
        assert proc.wait(timeout=30) == (0 if how == signal.SIGINT else -signal.SIGKILL)
        # Killed, the owner cannot stop them: they get SIGTERM from the kernel as it dies, and tear down.
        deadline = time.monotonic() + 60  # a hang guard: they go within a second or two
        while not all(_gone(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(_gone(pid) for pid in children)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("role", [["controller", "--port", "0"], ["worker", "--task", "calc"]])
def test_the_commands_refuse_a_bind_off_loopback_without_a_token(role):
    res = subprocess.run([sys.executable, "-m", "env_adapters.cli", *role, "--host", "0.0.0.0"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "without a token" in res.stderr and "--allow-no-token" in res.stderr, res.stderr


def test_a_token_source_is_one_of_token_and_token_file(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        load_config({"controller": {"token": "a", "token_file": str(tmp_path / "t")}})
    assert load_config({"controller": {"allow_no_token": True}}).controller.allow_no_token


@pytest.mark.slow
async def test_a_stack_with_a_token_file_serves_only_requests_that_carry_it(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "a token of the caller's shell")  # never reaches the stack: its own token does
    token_file = tmp_path / "env.token"
    config = {"controller": {"port": 0, "token_file": str(token_file)}, "workers": [{"task": "calc"}]}
    with EnvStack(config) as stack:
        token = token_file.read_text().strip()
        # The processes got the token through their environment: no command line (`ps`, any user) shows it.
        processes = [stack.controller.pid] + [proc.pid for _, proc in stack.workers]
        assert not any(token in " ".join(psutil.Process(pid).cmdline()) for pid in processes)
        assert all(psutil.Process(pid).environ().get(TOKEN_ENV) == token for pid in processes)
        async with EnvClient(stack.url, token=token) as client:
            assert len(await client.get_indices("calc")) > 0
        async with EnvClient(stack.url) as client:
            with pytest.raises(EnvRequestError) as refused:
                await client.get_indices("calc")
            assert refused.value.status_code == 401


@pytest.mark.slow
async def test_a_controller_restarted_on_its_port_gives_new_session_ids_and_gets_its_workers_back():
    config = {"controller": {"port": 0}, "workers": [{"task": "calc", "concurrency": 4, "heartbeat_interval": 0.2}]}
    with EnvStack(config) as stack:
        async with EnvClient(stack.url) as env:
            before = await env.start_sample("calc", 0)
        stack.kill_controller()
        stack.restart_controller()
        stack.wait_registered(1, timeout=30)
        async with EnvClient(stack.url) as env:  # a new connection: the old one went with the controller
            after = await env.start_sample("calc", 1)
            # The worker still holds the lost session: an id of the old controller would collide with it.
            assert after.session_id != before.session_id
            assert (await env.interact(after.session_id, STEP)).status == "running"
            with pytest.raises(EnvRequestError, match="404"):
                await env.interact(before.session_id, STEP)


@pytest.mark.slow
@pytest.mark.docker
def test_a_worker_killed_at_stop_leaves_no_container(docker_client, monkeypatch):
    from env_adapters import launcher
    from env_adapters.sandbox.containers import LABEL_OWNER, LABEL_SANDBOX
    from env_adapters.sandbox.images import ensure_image

    ensure_image(docker_client, "os-default")
    monkeypatch.setattr(launcher, "STOP_GRACE_S", 0.5)
    config = {"controller": {"port": 0}, "workers": [{"task": "os", "options": {"pool_size": 2}}]}

    def containers_of(pid: int) -> list[str]:
        return [c.name for c in docker_client.containers.list(all=True, filters={"label": LABEL_SANDBOX})
                if c.labels[LABEL_OWNER].split(":")[1] == str(pid)]

    stack = EnvStack(config)
    stack.start()
    try:
        pid = stack.workers[0][1].pid
        deadline = time.monotonic() + 120
        while not containers_of(pid):  # the pool pre-starts its containers
            assert time.monotonic() < deadline, "the os worker started no container"
            time.sleep(0.2)
    finally:
        # Stopped, the worker cannot act on SIGTERM: stop() has to kill it with its pool still there.
        os.kill(stack.workers[0][1].pid, signal.SIGSTOP)
        stack.stop()
    assert containers_of(pid) == []
