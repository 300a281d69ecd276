"""Controller behaviour, in process: dispatch, capacity, timeouts, faults and bad input (see conftest)."""

import asyncio
import time

import aiohttp
import orjson
import pytest

from env_adapters.client import EnvClient, EnvRequestError
from env_adapters.task import Session, Task
from env_adapters.tasks.calculator import CalculatorTask


def say(content):
    return {"role": "assistant", "content": content}


async def raw(stack, method, route, *, data=None, json=None, session_id=None, token=None):
    headers = {"session_id": str(session_id)} if session_id is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"{stack.url}/api/{route}", data=data, json=json, headers=headers) as r:
            return r.status, await r.json(), r.headers


def placement(stack):
    return sorted(len(w.sessions) for w in stack.controller.workers.values())


async def test_dispatch_to_least_loaded_and_full_cycle(local_stack):
    stack = await local_stack(workers=2, concurrency=3)
    async with EnvClient(stack.url) as env:
        started = [await env.start_sample("probe", i) for i in range(4)]
        assert placement(stack) == [2, 2]
        assert [s.messages[0]["content"] for s in started] == [f"probe {i}" for i in range(4)]
        reply = await env.interact(started[0].session_id, say("hi"))
        assert reply.status == "running" and reply.messages[0]["content"] == "echo hi" and not reply.finish
        reply = await env.interact(started[0].session_id, say("finish"))
        assert (reply.finish, reply.reward, reply.status) == (True, 1.0, "completed")
        assert reply.metrics == {"n": 1, "score": 1.0}
        assert placement(stack) == [1, 2]
        sessions = await env.list_sessions()
        assert sessions[str(started[0].session_id)]["status"] == "completed"
        workers = await env.list_workers()
        assert sorted(w["current"] for w in workers["probe"].values()) == [1, 2]
        assert (await env.get_indices("probe"))[:2] == [0, 1]


async def test_bad_input_gives_clear_4xx(local_stack):
    stack = await local_stack()
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 0)
        for call, code, text in [
            (env.start_sample("nope", 0), 404, "unknown task 'nope'"),
            (env.interact(12345, say("x")), 404, "unknown session 12345"),
            (env.get_indices("nope"), 404, "unknown task"),
            (env.start_sample("probe", 999), 400, "not served"),
        ]:
            with pytest.raises(EnvRequestError, match=text) as e:
                await call
            assert e.value.status_code == code
        sid = s.session_id
        status, body, _ = await raw(stack, "POST", "interact", data=b"{bad", session_id=sid)
        assert status == 400 and body["detail"].startswith("request body is not valid JSON")
        assert (await raw(stack, "POST", "interact", data=b"{}", session_id="abc"))[0] == 400
        assert (await raw(stack, "POST", "interact", data=b"{}"))[1]["detail"] == "missing 'session_id' header"
        status, body, _ = await raw(stack, "POST", "interact", json={"messages": [1, 2]}, session_id=sid)
        assert status == 400 and "exactly one" in body["detail"]
        status, body, _ = await raw(stack, "POST", "interact", data=b"x" * (5 * 2**20), session_id=sid)
        assert status == 413 and "large" in body["detail"].lower()
        # The model's own malformed call is not an HTTP error but an ended episode.
        reply = await env.interact(sid, say("invalid"))
        assert (reply.finish, reply.status) == (True, "agent invalid action")
        with pytest.raises(EnvRequestError, match="already finished") as e:
            await env.interact(sid, say("x"))
        assert e.value.status_code == 409
        await env.cancel(sid)  # finished: no error
        await env.cancel(999999)  # unknown: no error
    assert (await raw(stack, "GET", "nowhere"))[0] == 404


async def test_concurrent_interacts_on_one_session(local_stack):
    stack = await local_stack()
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 0)
        slow = asyncio.create_task(env.interact(s.session_id, say("sleep:0.3")))
        await asyncio.sleep(0.05)
        with pytest.raises(EnvRequestError, match="in flight") as e:
            await env.interact(s.session_id, say("x"))
        assert e.value.status_code == 409
        assert (await slow).status == "running"
        assert (await env.interact(s.session_id, say("x"))).status == "running"


async def test_busy_waits_then_answers_503_and_client_retries(local_stack):
    stack = await local_stack(workers=1, concurrency=1, start_wait=0.2)
    async with EnvClient(stack.url, max_retries=0) as env, EnvClient(stack.url, max_retries=20, backoff=0.05) as pat:
        first = await env.start_sample("probe", 0)
        t0 = time.monotonic()
        with pytest.raises(Exception, match="busy") as e:
            await env.start_sample("probe", 1)
        assert type(e.value).__name__ == "EnvUnavailable" and time.monotonic() - t0 >= 0.2
        waiting = asyncio.create_task(pat.start_sample("probe", 2))
        await asyncio.sleep(0.5)  # longer than start_wait: the patient client is retrying
        assert not waiting.done()
        await env.interact(first.session_id, say("finish"))
        second = await asyncio.wait_for(waiting, 5)
        assert second.messages[0]["content"] == "probe 2"
    # Exactly the two sessions exist: the retries started nothing twice.
    assert sorted(stack.controller.sessions) == [first.session_id, second.session_id]
    assert placement(stack) == [1]


async def test_waiting_start_gets_freed_slot(local_stack):
    stack = await local_stack(workers=1, concurrency=1, start_wait=5)
    async with EnvClient(stack.url) as env:
        first = await env.start_sample("probe", 0)
        waiting = asyncio.create_task(env.start_sample("probe", 1))
        await asyncio.sleep(0.1)
        await env.cancel(first.session_id)
        assert (await asyncio.wait_for(waiting, 2)).messages[0]["content"] == "probe 1"


async def test_cancel_frees_slot_and_interrupts_step(local_stack):
    stack = await local_stack(workers=1, concurrency=1)
    task = stack.workers[0].task
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 4)
        pending = asyncio.create_task(env.interact(s.session_id, say("sleep:30")))
        await asyncio.sleep(0.1)
        await env.cancel(s.session_id)
        assert (await asyncio.wait_for(pending, 5)).status == "cancelled"
        assert placement(stack) == [0] and task.closed == [4]
        await env.start_sample("probe", 5)
        assert await env.cancel_all("probe") and placement(stack) == [0]


async def test_idle_session_expires(local_stack):
    stack = await local_stack(workers=1, concurrency=1, session_idle_timeout=0.3, clean_interval=0.1)
    task = stack.workers[0].task
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 1)  # ... and the client goes away
        await asyncio.sleep(0.7)
        assert (await env.list_sessions())[str(s.session_id)]["status"] == "cancelled"
        assert placement(stack) == [0]
        await asyncio.sleep(0.1)
        assert task.closed == [1]
        await env.start_sample("probe", 2)  # capacity is back


async def test_interact_timeout_ends_session(local_stack):
    stack = await local_stack(workers=1, concurrency=1, interact_timeout=0.2)
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 1)
        reply = await env.interact(s.session_id, say("sleep:10"))
        assert (reply.finish, reply.status) == (True, "task error")
        await asyncio.sleep(0.1)
        assert stack.workers[0].task.closed == [1] and placement(stack) == [0]


async def test_running_reply_without_messages_is_task_error(local_stack):
    stack = await local_stack()
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 1)
        assert (await env.interact(s.session_id, say("silent"))).status == "task error"


async def test_dead_worker_sessions_end_and_new_go_elsewhere(local_stack):
    stack = await local_stack(workers=2, concurrency=3, heartbeat_timeout=0.5, clean_interval=0.1, start_wait=1)
    async with EnvClient(stack.url) as env:
        a = await env.start_sample("probe", 0)
        b = await env.start_sample("probe", 1)
        victim = stack.controller.sessions[a.session_id].worker
        doomed = a if stack.controller.sessions[b.session_id].worker is not victim else b
        survivor = b if doomed is a else a
        dead = next(w for w in stack.workers if w.address == victim.address)
        await dead.stop()
        reply = await env.interact(doomed.session_id, say("x"))  # connection refused -> ended at once
        assert (reply.finish, reply.status) == (True, "task error")
        assert "ConnectError" in reply.metrics["env_lost"]  # the refusal ended it, not an interact timeout
        assert (await env.interact(survivor.session_id, say("x"))).status == "running"
        for i in range(2):  # new sessions go to the remaining worker
            s = await env.start_sample("probe", i)
            assert stack.controller.sessions[s.session_id].worker is not victim


async def test_silent_worker_detected_by_heartbeat_and_restart_picked_up(local_stack):
    stack = await local_stack(workers=1, concurrency=2, heartbeat_timeout=0.4, clean_interval=0.1)
    worker = stack.workers[0]
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 0)
        worker._heartbeat.cancel()  # alive but silent
        await asyncio.sleep(0.8)
        assert (await env.list_sessions())[str(s.session_id)]["status"] == "task error"
        assert not next(iter((await env.list_workers())["probe"].values()))["alive"]
        with pytest.raises(EnvRequestError, match="already finished"):
            await env.interact(s.session_id, say("x"))
        await stack.add_worker()  # a restarted worker (new address) is used again
        s2 = await env.start_sample("probe", 1)
        assert (await env.interact(s2.session_id, say("x"))).status == "running"


HANG_GUARD_S = 60
"""Only against a hung test: the requests below wait for a worker that never answers (interact_timeout 240 s)."""


async def test_callers_waiting_on_a_frozen_worker_are_released_once_it_is_declared_down(local_stack):
    # Frozen: connections open, requests never answered, heartbeats stopped (as a SIGSTOPped process). One interact
    # and one start_sample wait on such workers; both end when the heartbeat sweep declares them down, not at
    # interact_timeout: the interact as the environment's loss (played again by a trainer), the start as busy.
    stack = await local_stack(workers=1, concurrency=1, heartbeat_timeout=0.5, clean_interval=0.1, start_wait=0.5)
    slow = SlowStartTask()
    await stack.add_worker(slow, name="slow", concurrency=1)
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 0)
        stepping = asyncio.create_task(env.interact(s.session_id, say("sleep:3600")))
        assert await eventually(lambda: stack.controller.sessions[s.session_id].busy)
        starting = asyncio.create_task(raw(stack, "POST", "start_sample", json={"name": "slow", "index": 0}))
        assert await eventually(lambda: slow.resetting)
        for worker in stack.workers:
            worker._heartbeat.cancel()
        reply = await asyncio.wait_for(stepping, HANG_GUARD_S)
        assert (reply.finish, reply.status) == (True, "task error")
        assert "no heartbeat" in reply.metrics["env_lost"]
        status, body, _ = await asyncio.wait_for(starting, HANG_GUARD_S)
        assert status == 503 and "busy" in body["detail"]


async def test_a_pause_of_the_controller_itself_ends_no_session(local_stack):
    # The whole process stops for twice the heartbeat timeout (the controller and its workers alike, as a SIGSTOP of
    # the controller looks to it): on resume the sweep runs before the heartbeats sent meanwhile are read, and the
    # pause is no worker's silence.
    stack = await local_stack(workers=1, concurrency=1, heartbeat_timeout=2.0, clean_interval=0.1)
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 0)
        time.sleep(4.0)  # blocks the event loop: nothing of the stack runs
        await asyncio.sleep(0.5)  # sweeps and heartbeats run again
        assert (await env.list_sessions())[str(s.session_id)]["status"] == "running"
        assert all(w["alive"] for w in (await env.list_workers())["probe"].values())
        assert (await env.interact(s.session_id, say("x"))).status == "running"


async def test_restart_on_same_address_ends_old_sessions(local_stack):
    stack = await local_stack(workers=1, concurrency=2)
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 0)
        entry = next(iter(stack.controller.workers.values()))
        status, _, _ = await raw(stack, "POST", "receive_heartbeat", json={
            "name": "probe", "address": entry.address, "concurrency": 2, "indices": [0], "instance": "new-boot"})
        assert status == 200
        assert (await env.list_sessions())[str(s.session_id)]["status"] == "task error"
        assert entry.alive and placement(stack) == [0]


async def test_mark_stale_drains_worker(local_stack):
    stack = await local_stack(workers=2, concurrency=4)
    stale_id = min(stack.controller.workers)
    status, body, _ = await raw(stack, "POST", "mark_stale", json={"name": "probe", "worker_id": stale_id,
                                                                   "stale": True})
    assert status == 200 and body["stale"]
    async with EnvClient(stack.url) as env:
        for i in range(3):
            s = await env.start_sample("probe", i)
            assert stack.controller.sessions[s.session_id].worker.id != stale_id
    assert (await raw(stack, "POST", "mark_stale", json={"worker_id": 999}))[0] == 404


async def test_worker_cancel_notice(local_stack):
    stack = await local_stack()
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 0)
        worker = stack.workers[0]
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{worker.address}/cancel_with_notice", json={"session_id": s.session_id}) as r:
                assert r.status == 200
        for _ in range(50):
            if (await env.list_sessions())[str(s.session_id)]["status"] == "cancelled":
                break
            await asyncio.sleep(0.02)
        assert (await env.list_sessions())[str(s.session_id)]["status"] == "cancelled"
        assert placement(stack) == [0]


async def test_token_auth(local_stack):
    stack = await local_stack(token="s3cret")
    assert (await raw(stack, "GET", "list_workers"))[0] == 401
    assert (await raw(stack, "GET", "list_workers", token="wrong"))[0] == 401
    async with EnvClient(stack.url, token="s3cret") as env:
        s = await env.start_sample("probe", 0)  # controller -> worker also authenticated
        assert (await env.interact(s.session_id, say("x"))).status == "running"
    async with EnvClient(stack.url) as env:
        with pytest.raises(EnvRequestError) as e:
            await env.list_workers()
        assert e.value.status_code == 401


async def test_finished_sessions_forgotten(local_stack):
    stack = await local_stack(finished_ttl=0.2, clean_interval=0.1)
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 0)
        await env.interact(s.session_id, say("finish"))
        await asyncio.sleep(0.5)
        assert str(s.session_id) not in await env.list_sessions()


async def test_malformed_tool_calls_end_as_invalid_action_never_task_error(local_stack):
    stack = await local_stack(workers=0)
    await stack.add_worker(CalculatorTask(), name="calc", concurrency=2)
    good = {"name": "calculate", "arguments": '{"expression": "1+2"}'}
    shapes = [
        "calculate", {"function": good}, ["calculate"], [None], [[{"function": good}]], [{"id": "c"}],
        [{"function": "calculate"}], [{"function": {"function": good}}],
        [{"function": {**good, "name": ["calculate"]}}], [{"function": {**good, "arguments": 5}}],
        [{"function": {**good, "arguments": '["1+2"]'}}],
        [{"function": {**good, "arguments": '{"expression": "1+\\ud800"}'}}], [{"id": 7, "function": good}],
    ]
    async with EnvClient(stack.url) as env:
        for tool_calls in shapes:
            s = await env.start_sample("calc", 0)
            reply = await env.interact(s.session_id, {"role": "assistant", "content": "", "tool_calls": tool_calls})
            assert (reply.status, reply.finish) == ("agent invalid action", True), tool_calls
        # Text that is not valid Unicode, as a parser that decodes the model's JSON can hand over (raw surrogates).
        for message in [{"role": "assistant", "content": "", "tool_calls": [
                            {"function": {**good, "arguments": '{"expression": "1+\ud800"}'}}]},
                        {"role": "assistant", "content": "\udfff", "tool_calls": [{"function": good}]}]:
            s = await env.start_sample("calc", 0)
            reply = await env.interact(s.session_id, message)
            assert (reply.status, reply.finish) == ("agent invalid action", True), message
        s = await env.start_sample("calc", 0)
        reply = await env.interact(s.session_id, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": good}]})
        assert reply.status == "running" and reply.messages[0]["content"] == "3"


@pytest.mark.parametrize("index", [True, False, 0.0, 1.5, None, [1], {"i": 1}])
async def test_index_must_be_an_integer_or_a_string(local_stack, index):
    stack = await local_stack()
    status, body, _ = await raw(stack, "POST", "start_sample", json={"name": "probe", "index": index})
    assert status == 400 and "'index' must be an integer or a string" in body["detail"]
    worker = stack.workers[0]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{worker.address}/start_sample", json={"index": index, "session_id": 1}) as r:
            assert r.status == 400 and "'index' must be an integer or a string" in (await r.json())["detail"]
    assert placement(stack) == [0]


@pytest.mark.parametrize("custom_task", ["x", 1, [1], True])
async def test_custom_task_must_be_an_object_or_null(local_stack, custom_task):
    stack = await local_stack()
    body = {"name": "probe", "index": -1, "custom_task": custom_task}
    status, reply, _ = await raw(stack, "POST", "start_sample", json=body)
    assert status == 400 and "'custom_task' must be an object or null" in reply["detail"]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{stack.workers[0].address}/start_sample", json={**body, "session_id": 1}) as r:
            assert r.status == 400 and "'custom_task' must be an object or null" in (await r.json())["detail"]
    assert placement(stack) == [0]


async def test_body_just_under_the_limit_passes_the_controller_hop(local_stack):
    stack = await local_stack(max_body_mb=0.5)
    stack.workers[0]._server.max_body -= int(3.5 * 2**20)  # the worker's limit equals the controller's: 0.5 MiB
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 0)
        envelope = len(orjson.dumps({"messages": [say("")]}))
        content = "x" * (int(0.5 * 2**20) - envelope)
        status, body, _ = await raw(stack, "POST", "interact", data=orjson.dumps({"messages": [say(content)]}),
                                    session_id=s.session_id)
        assert status == 200 and body["status"] == "running" and body["messages"][0]["content"] == f"echo {content}"
        status, body, _ = await raw(stack, "POST", "interact", data=orjson.dumps({"messages": [say(content + "x")]}),
                                    session_id=s.session_id)
        assert status == 413


async def send_and_hang_up(url, payload, until):
    """Send ``payload`` on a raw connection, wait for ``until()`` to hold, then close the connection."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(payload)
    for _ in range(500):
        if until():
            break
        await asyncio.sleep(0.01)
    assert until()
    writer.close()
    await writer.wait_closed()


async def eventually(condition):
    for _ in range(500):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


class SlowStartSession(Session):
    def __init__(self, task):
        self.task = task

    async def reset(self):
        self.task.resetting = True
        await asyncio.sleep(3600)

    async def step(self, message):
        raise AssertionError("never reached")

    async def close(self):
        self.task.closed += 1


class SlowStartTask(Task):
    """Sessions whose reset never ends (as a container that does not come up)."""

    def __init__(self):
        self.resetting, self.closed = False, 0

    def indices(self):
        return [0]

    async def start_session(self, index, custom_task=None):
        return SlowStartSession(self)


async def test_start_sample_of_a_departed_client_frees_the_slot_at_once(local_stack):
    stack = await local_stack(workers=0)  # session_idle_timeout stays 300 s: the slot must not wait for it
    task = SlowStartTask()
    await stack.add_worker(task, name="slow", concurrency=1)
    body = orjson.dumps({"name": "slow", "index": 0})
    request = b"POST /api/start_sample HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    await send_and_hang_up(stack.url, request, lambda: task.resetting)
    assert await eventually(lambda: task.closed == 1 and placement(stack) == [0])
    assert not stack.workers[0]._slots and not stack.controller.sessions


async def test_interact_of_a_departed_client_cancels_the_session(local_stack):
    stack = await local_stack()
    task = stack.workers[0].task
    async with EnvClient(stack.url) as env:
        s = await env.start_sample("probe", 3)
        body = orjson.dumps({"messages": [say("sleep:3600")]})
        request = (b"POST /api/interact HTTP/1.1\r\nHost: x\r\nsession_id: %d\r\nContent-Length: %d\r\n\r\n%s"
                   % (s.session_id, len(body), body))
        await send_and_hang_up(stack.url, request, lambda: stack.controller.sessions[s.session_id].busy)
        assert await eventually(lambda: task.closed == [3] and placement(stack) == [0])
        assert (await env.list_sessions())[str(s.session_id)]["status"] == "cancelled"


async def test_slots_of_cancelled_sessions_count_until_the_worker_has_the_cancel(local_stack):
    """Starts right after a cancel_all wait for the worker to free the slots: no 406 storm, no duplicate cancels,
    and no session ended by mistake while the views re-sync."""
    stack = await local_stack(workers=1, concurrency=4, start_wait=10)
    worker = stack.workers[0]
    cancel = worker._server.routes[("POST", "/api/cancel")]
    received = []

    async def slow_cancel(request):
        received.append(request.body)
        await asyncio.sleep(0.2)
        return await cancel(request)

    worker._server.routes[("POST", "/api/cancel")] = slow_cancel
    async with EnvClient(stack.url) as env:
        first = [await env.start_sample("probe", i) for i in range(4)]
        assert len(await env.cancel_all("probe")) == 4
        second = await asyncio.gather(*(env.start_sample("probe", i) for i in range(4)))
        for s in second:
            assert (await env.interact(s.session_id, say("x"))).status == "running"
    assert len(received) == 4
    statuses = {sid: s.status.value for sid, s in stack.controller.sessions.items()}
    assert [statuses[s.session_id] for s in first] == ["cancelled"] * 4
    assert [statuses[s.session_id] for s in second] == ["running"] * 4



def health_of(workers):
    (entry,) = workers["probe"].values()
    return entry["healthy"], entry["problem"]


async def test_unhealthy_worker_gets_no_new_sessions_and_keeps_its_running_ones(local_stack, probe_task):
    health = {"ok": True}

    async def healthy():
        return health["ok"]

    probe_task.healthy = healthy
    stack = await local_stack(workers=0, start_wait=0.3)
    await stack.add_worker(probe_task, concurrency=4)
    (entry,) = stack.controller.workers.values()
    async with EnvClient(stack.url, max_retries=0) as env:
        running = await env.start_sample("probe", 0)
        assert health_of(await env.list_workers()) == (True, None)
        health["ok"] = False
        assert await eventually(lambda: entry.problem is not None)
        healthy_flag, problem = health_of(await env.list_workers())
        assert not healthy_flag and "reports itself unhealthy" in problem
        with pytest.raises(Exception, match="1 unhealthy worker") as e:
            await env.start_sample("probe", 1)
        assert type(e.value).__name__ == "EnvUnavailable"
        # The running session goes on, on the unhealthy worker.
        assert (await env.interact(running.session_id, say("still here"))).messages[0]["content"] == "echo still here"
        assert entry.alive
        health["ok"] = True
        assert await eventually(lambda: entry.problem is None)
        assert health_of(await env.list_workers()) == (True, None)
        assert (await env.start_sample("probe", 2)).messages[0]["content"] == "probe 2"
        assert (await env.interact(running.session_id, say("finish"))).status == "completed"


async def test_hanging_or_failing_health_check_never_starves_heartbeats(local_stack, probe_task):
    checks = []
    mode = {"hang": True}

    async def healthy():
        checks.append(time.monotonic())
        if mode["hang"]:
            await asyncio.sleep(3600)
        raise RuntimeError("backend probe broke")

    probe_task.healthy = healthy
    stack = await local_stack(workers=0, heartbeat_timeout=0.5, clean_interval=0.05)
    worker = await stack.add_worker(probe_task, health_timeout=0.3)
    (entry,) = stack.controller.workers.values()
    assert await eventually(lambda: "has not answered" in (entry.problem or ""))
    await asyncio.sleep(1.0)  # two heartbeat timeouts: a starved heartbeat would mark the worker dead
    assert entry.alive and "has not answered" in entry.problem
    assert len(checks) == 1  # a check still running is awaited, never started again
    mode["hang"] = False
    worker._check.cancel()  # the hanging check ends (as cancelled); the next one raises
    assert await eventually(lambda: "backend probe broke" in (entry.problem or ""))
    assert entry.alive and len(checks) >= 2
    async with EnvClient(stack.url) as env:
        assert "backend probe broke" in health_of(await env.list_workers())[1]
