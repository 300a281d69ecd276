"""The worker's AgentBench-FC routes, in process, against a scripted ProbeTask (see conftest)."""

import asyncio

import aiohttp
import pytest

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
    assert (env_out["status"], env_out["finish"], env_out["reward"], env_out["metric"]) == ("completed", True, 1.0,
                                                                                            {"n": 1})
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
