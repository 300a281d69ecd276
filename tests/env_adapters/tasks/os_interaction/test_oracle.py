"""The ``os`` task through the real controller and worker: the data's own solutions earn 1, wrong answers 0,
and no container outlives its session (cancelled sessions, a killed and restarted worker, a stopped stack).

All 1000 train items are played by ``python -m env_adapters.tasks.os_interaction.oracle --split train``
(outside the suite: ~10 minutes); here the dev split plus a seeded sample of train.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from importlib import resources

import pytest

pytest.importorskip("docker")

from env_adapters.client import EnvClient  # noqa: E402
from env_adapters.launcher import EnvStack  # noqa: E402
from env_adapters.protocol import SampleStatus  # noqa: E402
from env_adapters.sandbox.containers import LABEL_OWNER, LABEL_SANDBOX, owner_alive  # noqa: E402
from env_adapters.tasks.os_interaction.items import VENDORED_SCRIPTS, load_split, parse_item  # noqa: E402
from env_adapters.tasks.os_interaction.oracle import play_oracle, tool_call_message  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.docker]

# The data's own scripts end in well under a second: the command timeout only has to outlast a busy machine
# (with 20 s, dev[12]'s `find /home` once earned 0 in a loaded run; the transcript of any failure is reported).
OPTIONS = {"split": "dev", "pool_size": 4, "command_timeout": 120}
CONCURRENCY = 8
# Items whose own example cannot earn reward 1 (upstream too): the data is at fault, not the task.
KNOWN_DEV_DEFECTS = {
    8: "the example prints `du -sh` output (8.0K) that upstream's size-match checker cannot parse (integers only)",
}
KNOWN_DATA_DEFECTS = {
    252: "the example prints two numbers (files, directories) but the check is integer-match",
    540: "the example gunzips the logs, so re-running it for the check also prints gzip's error (stderr is part "
         "of the reference, as upstream's exec_run merges it)",
    683: "the example removes duplicate lines, so re-running it for the check prints a smaller count",
}
TRAIN_SAMPLE = sorted(random.Random(0).sample(sorted(set(range(1000)) - set(KNOWN_DATA_DEFECTS)), 40))


@pytest.fixture(scope="module")
def stack(env_stack, docker_client):
    return env_stack("os", options=OPTIONS, concurrency=CONCURRENCY)


def _raw_train_items() -> list[dict]:
    path = resources.files("env_adapters") / "data" / "agentbench" / "os_interaction" / "train.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _send(env: EnvClient, session_id: int, transcript: list):
    async def send(message):
        response = await env.interact(session_id, message)
        transcript.extend([message, *response.messages])
        return response.messages, response.status.value, response.reward

    return send


async def _container_of(env: EnvClient, session_id: int) -> str:
    """The short id of a session's container (Docker sets it as the hostname)."""
    response = await env.interact(session_id, tool_call_message("bash_action", script="hostname"))
    return response.messages[0]["content"].strip()


def _sandboxes(client, **filters) -> list[dict]:
    """Our labelled containers (low-level listing: no inspect that races with removals)."""
    return client.api.containers(all=True, filters={"label": LABEL_SANDBOX, **filters})


def _wait_gone(client, container: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _sandboxes(client, id=container) and not _sandboxes(client, name=container):
            return True
        time.sleep(0.2)
    return False


async def test_oracle_earns_one_on_dev_and_a_train_sample(stack):
    dev = load_split("dev")
    raw_train = _raw_train_items()
    jobs = [(f"dev[{i}]", i, None, dev[i]) for i in range(len(dev)) if i not in KNOWN_DEV_DEFECTS]
    jobs += [(f"train[{i}]", -1, raw_train[i], parse_item(raw_train[i], scripts=VENDORED_SCRIPTS))
             for i in TRAIN_SAMPLE]
    gate = asyncio.Semaphore(CONCURRENCY)
    results, transcripts = {}, {}

    async def play(env, name, index, custom, item):
        async with gate:
            started = await env.start_sample("os", index, custom_task=custom)
            assert started.status is SampleStatus.RUNNING, (name, started)
            assert [t["function"]["name"] for t in started.tools] == ["bash_action", "answer_action", "finish_action"]
            transcripts[name] = []
            results[name] = await play_oracle(item, _send(env, started.session_id, transcripts[name]))

    async with EnvClient(stack.url) as env:
        outcomes = await asyncio.gather(*(play(env, *job) for job in jobs), return_exceptions=True)
    # Every item that did not earn 1, with what it got (or raised) and the end of its transcript.
    failures = {job[0]: (results.get(job[0], outcome), transcripts.get(job[0], [])[-4:])
                for job, outcome in zip(jobs, outcomes, strict=True)
                if results.get(job[0]) != ("completed", 1.0)}
    assert len(jobs) == 65 and not failures, "\n".join(f"{name}: {got!r}" for name, got in failures.items())


async def test_wrong_answers_earn_zero_through_the_stack(stack):
    async with EnvClient(stack.url) as env:
        for index, answer in [(1, "loga"), (9, "3"), (22, "installed")]:
            started = await env.start_sample("os", index)
            response = await env.interact(started.session_id, tool_call_message("answer_action", answer=answer))
            assert (response.status, response.reward) == (SampleStatus.COMPLETED, 0.0)


async def test_cancelled_sessions_leave_no_container(stack, docker_client):
    async with EnvClient(stack.url) as env:
        started = [await env.start_sample("os", 13) for _ in range(2)]
        containers = [await _container_of(env, s.session_id) for s in started]
        assert all(_sandboxes(docker_client, id=c) for c in containers)
        for s in started:
            await env.cancel(s.session_id)
    assert all(_wait_gone(docker_client, c) for c in containers)


def _owned_by(client, pid: int) -> list[str]:
    return [c["Names"][0].lstrip("/") for c in _sandboxes(client)
            if c["Labels"].get(LABEL_OWNER, "").split(":")[1:2] == [str(pid)]]


async def test_killed_worker_leaves_nothing_after_restart_and_stop(docker_client):
    config = {"controller": {"port": 0},
              "workers": [{"task": "os", "concurrency": 2, "options": {**OPTIONS, "pool_size": 1}}]}
    stack = EnvStack(config)
    stack.start()
    try:
        async with EnvClient(stack.url) as env:
            started = await env.start_sample("os", 13)
            container = await _container_of(env, started.session_id)
        dead_pid = stack.workers[0][1].pid
        stack.kill_worker(0)
        # The session's container and the pool's survive the SIGKILL, labelled with an owner that is gone.
        orphans = _owned_by(docker_client, dead_pid)
        assert len(orphans) >= 2 and _sandboxes(docker_client, id=container)
        stack.restart_worker(0)  # its setup reaps what its predecessor left
        assert _wait_gone(docker_client, container)
        assert all(_wait_gone(docker_client, name, 5) for name in orphans)
        new_pid = stack.workers[0][1].pid
    finally:
        stack.stop()
    assert not _owned_by(docker_client, new_pid)
    leftovers = [c["Names"][0] for c in _sandboxes(docker_client) if owner_alive(c["Labels"][LABEL_OWNER]) is False]
    assert not leftovers
