"""The worker's AgentBench-FC routes, in process, against a scripted ProbeTask (see conftest)."""

import asyncio
import threading
from typing import Any

import aiohttp
import pytest

from env_adapters.client import EnvClient
from env_adapters.protocol import ENV_LOST
from env_adapters.task import Session, StepResult, SyncSession, Task, run_blocking
from env_adapters.worker import Worker, parse_options


@pytest.fixture
async def worker(probe_task):
    worker = Worker(probe_task, name="probe", concurrency=2)
    await worker.start()
    async with aiohttp.ClientSession() as http:
        worker.http = http
        yield worker
    await worker.stop()


async def post(worker, route, body):
    async with worker.http.post(f"{worker.address}/{route}", json=body) as r:
        return r.status, await r.json(), r.headers


async def start(worker, sid, index=0):
    return await post(worker, "start_sample", {"index": index, "session_id": sid, "custom_task": None})


async def interact(worker, sid, content):
    return await post(worker, "interact", {"session_id": sid, "messages": [{"role": "assistant", "content": content}]})


async def test_session_lifecycle_and_close_once(worker):
    status, out, headers = await start(worker, 7, index=3)
    assert status == 200 and headers["session_id"] == "7"
    assert out["messages"] == [{"role": "user", "content": "probe 3"}] and out["status"] == "running"
    status, out, _ = await interact(worker, 7, "hello")
    assert status == 200 and out["session_id"] == 7 and out["env_out"]["messages"][0]["content"] == "echo hello"
    status, out, _ = await interact(worker, 7, "finish")
    env_out = out["env_out"]
    # A finished episode's metrics carry ``score`` (upstream's ``metric_score``); the probe sets none: the reward.
    assert (env_out["status"], env_out["finish"], env_out["reward"], env_out["metric"]) == ("completed", True, 1.0,
                                                                                            {"n": 1, "score": 1.0})
    assert worker.task.closed == [3]
    status, out, _ = await interact(worker, 7, "hello")
    assert status == 400 and "unknown session 7" in out["detail"]


async def test_duplicate_full_and_bad_index(worker):
    assert (await start(worker, 1))[0] == 200
    status, out, _ = await start(worker, 1)
    assert status == 400 and "already exists" in out["detail"]
    assert (await start(worker, 2))[0] == 200
    status, out, _ = await start(worker, 3)
    assert status == 406 and "full" in out["detail"]
    await post(worker, "cancel", {"session_id": 1})
    status, out, _ = await start(worker, 4, index=999)
    assert status == 400 and "not served" in out["detail"]
    assert (await start(worker, 4))[0] == 200


@pytest.mark.parametrize(("content", "status"), [("raise", "task error"), ("invalid", "agent invalid action")])
async def test_task_exceptions_become_statuses(worker, content, status):
    await start(worker, 1, index=5)
    code, out, _ = await interact(worker, 1, content)
    assert code == 200 and out["env_out"]["status"] == status and out["env_out"]["finish"]
    assert worker.task.closed == [5]
    assert (await post(worker, "sample_status", {"session_id": 1}))[0] == 400  # gone: its slot is free


async def test_an_episode_the_environment_lost_is_marked_so(worker):
    await start(worker, 1, index=5)
    code, out, _ = await interact(worker, 1, "lost")
    assert code == 200 and out["env_out"]["status"] == "task error" and out["env_out"]["finish"]
    assert out["env_out"]["metric"][ENV_LOST] == "the backend stopped answering"  # a trainer plays it again
    assert worker.task.closed == [5]


async def test_reset_error_is_task_error_and_closes(worker):
    status, out, _ = await start(worker, 1, index="fail-reset")
    assert status == 200 and out["status"] == "task error" and out["finish"]
    assert worker.task.closed == ["fail-reset"]


async def test_concurrent_interact_rejected_and_cancel_interrupts_step(worker):
    await start(worker, 1)
    slow = asyncio.create_task(interact(worker, 1, "sleep:30"))
    await asyncio.sleep(0.1)
    status, out, _ = await interact(worker, 1, "hello")
    assert status == 400 and "busy" in out["detail"]
    assert (await post(worker, "cancel", {"session_id": 1}))[1]["cancelled"] is True
    status, out, _ = await asyncio.wait_for(slow, 5)
    assert out["env_out"]["status"] == "cancelled"
    assert worker.task.closed == [0]
    assert (await post(worker, "cancel", {"session_id": 1}))[1]["cancelled"] is False  # idempotent


async def test_bad_requests_are_clear_4xx(worker):
    async with worker.http.post(f"{worker.address}/interact", data=b"{nope") as r:
        assert r.status == 400 and "not valid JSON" in (await r.json())["detail"]
    status, out, _ = await post(worker, "interact", {"messages": []})
    assert status == 400 and "session_id" in out["detail"]
    await start(worker, 1)
    status, out, _ = await post(worker, "interact", {"session_id": 1, "messages": "hi"})
    assert status == 400 and "exactly one" in out["detail"]
    async with worker.http.post(f"{worker.address}/interact", data=b"x" * (5 * 2**20)) as r:
        assert r.status == 413


async def test_a_custom_task_that_is_not_valid_unicode_is_refused(worker):
    # JSON may escape a lone surrogate; no task code gets such text (a shell or a database could not take it).
    body = b'{"index": -1, "session_id": 1, "custom_task": {"description": "x", "create": {"init": "echo \\ud800"}}}'
    async with worker.http.post(f"{worker.address}/start_sample", data=body) as r:
        assert r.status == 400 and "'custom_task' cannot be read" in (await r.json())["detail"]
    assert (await start(worker, 1))[0] == 200  # the slot was never taken


async def test_info_routes(worker):
    async with worker.http.get(f"{worker.address}/get_indices") as r:
        assert (await r.json())[:3] == [0, 1, 2]
    await start(worker, 1)
    async with worker.http.get(f"{worker.address}/worker_status") as r:
        assert (await r.json())["current"] == 1
    async with worker.http.get(f"{worker.address}/get_sessions") as r:
        assert list(await r.json()) == ["1"]
    assert (await post(worker, "cancel_all", {}))[1]["cancelled"] == [1]


async def test_stop_closes_sessions_and_tears_down(probe_task):
    task = probe_task
    worker = Worker(task, name="probe", concurrency=4)
    await worker.start()
    assert task.setup_calls == 1
    async with aiohttp.ClientSession() as http:
        worker.http = http
        await start(worker, 1, index=1)
        await start(worker, 2, index=2)
        pending = asyncio.create_task(interact(worker, 2, "sleep:30"))
        await asyncio.sleep(0.1)
        await worker.stop()
        await worker.stop()
        pending.cancel()
    assert sorted(task.closed) == [1, 2] and task.teardown_calls == 1


def test_parse_options(tmp_path):
    path = tmp_path / "o.yaml"
    path.write_text("seed: 3\nstep_latency: {dist: fixed, s: 0.1}\n")
    assert parse_options(["size=5", "seed=4"], str(path)) == {"seed": 4, "size": 5,
                                                             "step_latency": {"dist": "fixed", "s": 0.1}}
    with pytest.raises(ValueError, match="key=value"):
        parse_options(["size"], None)


# ---- blocking task code ----------------------------------------------------------------------------


class BlockingTask(Task):
    """Sessions whose step ``wait`` sleeps in a blocking wait and ``spin`` busy-loops (holding the GIL between
    switches), both until the test sets ``release``; ``thread`` answers the name of the thread running it.
    ``asynchronous=True`` opens async sessions that make the same calls through ``run_blocking``."""

    def __init__(self, asynchronous: bool = False) -> None:
        self.asynchronous = asynchronous
        self.release, self.blocking = threading.Event(), threading.Event()
        self.closed: list[Any] = []
        self.overlap = False  # set if close ever ran while a step of the same session was running

    def indices(self) -> list[int]:
        return list(range(4))

    async def start_session(self, index, custom_task=None):
        session = BlockingSession(self, index)
        return AsyncBlockingSession(session) if self.asynchronous else session


class BlockingSession(SyncSession):
    def __init__(self, task: BlockingTask, index: int) -> None:
        self.task, self.index, self.stepping = task, index, False

    def reset(self) -> StepResult:
        return StepResult(messages=[{"role": "user", "content": f"blocking {self.index}"}], tools=[])

    def step(self, message) -> StepResult:
        self.stepping = True
        command = message["content"]
        if command in ("wait", "spin"):
            self.task.blocking.set()
            if command == "wait":
                self.task.release.wait(30)
            else:
                while not self.task.release.is_set():
                    pass
        self.stepping = False
        return StepResult(messages=[{"role": "user", "content": f"{command} in {threading.current_thread().name}"}])

    def close(self) -> None:
        self.task.overlap |= self.stepping
        self.task.closed.append(self.index)


class AsyncBlockingSession(Session):
    def __init__(self, session: BlockingSession) -> None:
        self.session = session

    async def reset(self) -> StepResult:
        return self.session.reset()

    async def step(self, message) -> StepResult:
        return await run_blocking(self.session.step, message)

    async def close(self) -> None:
        self.session.close()


def say(content):
    return {"role": "assistant", "content": content}


@pytest.mark.parametrize(("command", "asynchronous"), [("wait", False), ("spin", False), ("spin", True)])
async def test_blocking_step_starves_neither_heartbeats_nor_other_sessions(local_stack, command, asynchronous):
    timeout = 1.5  # generous: a thread spinning in Python holds the GIL, and this machine may be loaded
    stack = await local_stack(workers=0, heartbeat_timeout=timeout, clean_interval=0.05)
    task = BlockingTask(asynchronous)
    await stack.add_worker(task, name="blocking", concurrency=3, heartbeat_interval=0.05)
    entry = next(iter(stack.controller.workers.values()))
    try:
        async with EnvClient(stack.url) as env:
            stuck, other = [await env.start_sample("blocking", i) for i in range(2)]
            blocked = asyncio.create_task(env.interact(stuck.session_id, say(command)))
            while not task.blocking.is_set():
                await asyncio.sleep(0.01)
            seen, replies = entry.last_seen, 0
            loop = asyncio.get_running_loop()
            end = loop.time() + 2 * timeout
            while loop.time() < end:  # the other session keeps answering while the step blocks
                reply = await env.interact(other.session_id, say(f"hi {replies}"))
                assert reply.status == "running" and reply.messages[0]["content"].startswith(f"hi {replies} in ")
                replies += 1
            assert not blocked.done() and replies > 1
            assert entry.alive and entry.last_seen > seen  # heartbeats kept coming
            assert {s["status"] for s in (await env.list_sessions()).values()} == {"running"}
            task.release.set()
            reply = await asyncio.wait_for(blocked, 10)
            assert reply.status == "running" and reply.messages[0]["content"].startswith(f"{command} in blocking-task")
            assert entry.alive
    finally:
        task.release.set()


async def test_cancel_of_blocked_step_closes_after_it_returns(local_stack):
    stack = await local_stack(workers=0)
    task = BlockingTask()
    await stack.add_worker(task, name="blocking", concurrency=1)
    try:
        async with EnvClient(stack.url) as env:
            s = await env.start_sample("blocking", 2)
            blocked = asyncio.create_task(env.interact(s.session_id, say("wait")))
            while not task.blocking.is_set():
                await asyncio.sleep(0.01)
            await env.cancel(s.session_id)
            assert (await asyncio.wait_for(blocked, 10)).status == "cancelled"
            await asyncio.sleep(0.1)
            assert task.closed == []  # the step still runs in its thread: close waits for it
            task.release.set()
            for _ in range(500):
                if task.closed:
                    break
                await asyncio.sleep(0.01)
            assert task.closed == [2] and not task.overlap
    finally:
        task.release.set()


async def test_threads_bound_blocking_calls():
    task = BlockingTask()
    worker = Worker(task, name="blocking", concurrency=2, threads=1)
    await worker.start()
    try:
        async with aiohttp.ClientSession() as http:
            worker.http = http
            for sid in (1, 2):
                assert (await start(worker, sid, index=sid))[0] == 200
            first = asyncio.create_task(interact(worker, 1, "wait"))
            while not task.blocking.is_set():
                await asyncio.sleep(0.01)
            second = asyncio.create_task(interact(worker, 2, "hello"))
            await asyncio.sleep(0.3)
            assert not second.done()  # the one thread is taken
            task.release.set()
            for call in (first, second):
                _, out, _ = await asyncio.wait_for(call, 10)
                assert out["env_out"]["status"] == "running"
    finally:
        task.release.set()
        await worker.stop()
    assert sorted(task.closed) == [1, 2]
    with pytest.raises(ValueError, match="threads"):
        Worker(task, name="x", threads=0)
