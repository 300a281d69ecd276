"""Worker server: hosts one :class:`~env_adapters.task.Task` behind the AgentBench-FC worker API.

Routes (under ``/api``, as the upstream ``agentrl-worker``): ``POST start_sample`` (400 on a duplicate session
id, 406 when ``concurrency`` sessions run), ``POST interact`` (400 for an unknown or busy session),
``POST cancel``, ``POST cancel_with_notice``, ``POST cancel_all``, ``GET get_indices``, ``GET get_sessions``,
``GET worker_status``, ``POST sample_status``. With a controller URL the worker heartbeats to it (``name``,
``address``, ``concurrency``, ``indices``; our extensions add ``instance``, a per-process id, so a controller
notices a restart even on the same address, and ``healthy``/``problem``, the task's own health).

Before each heartbeat the worker polls :meth:`~env_adapters.task.Task.healthy`, waiting for it at most
``min(1 s, heartbeat_interval / 4)`` so that a slow check never delays the heartbeat: a check still running is
awaited at the next beat (never two at once) and counts as unhealthy once it has run ``health_timeout`` seconds.

Task code runs here and only here, so this is the one place where task exceptions become statuses:
:class:`~env_adapters.task.InvalidAction` -> ``agent invalid action``, :class:`~env_adapters.task.EnvironmentLost` ->
``task error`` marked ``env_lost`` (played again by a trainer), anything else -> ``task error`` (logged with its
traceback). ``Session.close`` runs exactly once per session whatever ends it.

A :class:`~env_adapters.task.SyncSession` is wrapped into a :class:`~env_adapters.task.Session` whose methods
await its blocking ones in the worker's thread pool (``threads`` threads), the same pool
:func:`~env_adapters.task.run_blocking` uses; everything else treats both kinds alike.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
import uuid
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from env_adapters.http import (
    DEFAULT_MAX_BODY_MB,
    ENVELOPE_BYTES,
    SHUTDOWN_GRACE_S,
    TOKEN_ENV,
    ClientError,
    Handler,
    HTTPClient,
    HTTPError,
    HTTPServer,
    InsecureBindError,
    Request,
    Response,
    auth_headers,
    body_custom_task,
    body_index,
    body_message,
    body_session_id,
    check_bind,
    drain,
    json_response,
    read_json,
    run_until_signal,
)
from env_adapters.protocol import ENV_LOST, Index, Message, SampleStatus
from env_adapters.task import (
    EnvironmentLost,
    InvalidAction,
    Session,
    StepResult,
    Task,
    blocking_context,
    get_task_class,
    open_session,
    task_families,
)

logger = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_INTERVAL = 8.0
DEFAULT_HEALTH_TIMEOUT = 10.0


@dataclass(eq=False)
class _Slot:
    """A session as the worker tracks it; the slot counts against ``concurrency`` until it ends."""

    id: int
    index: Index
    session: Session | None = None
    status: SampleStatus = SampleStatus.RUNNING
    step: asyncio.Task | None = None  # the reset/step in progress, cancelled by a cancel
    ended: bool = False
    created: float = field(default_factory=time.monotonic)


async def _checked_step(session: Session, message: Message) -> StepResult:
    """``session.step(message)`` for a message that is valid Unicode; else the agent's invalid action.

    The one place where messages enter task code: text with a lone UTF-16 surrogate would fail deep inside a task
    (a shell, a database driver) as a task error.
    """
    try:
        orjson.dumps(message)  # refuses exactly such text; about a microsecond per KB
    except orjson.JSONEncodeError as e:
        raise InvalidAction(f"the message cannot be read: {e}") from e
    return await session.step(message)


def _output(result: StepResult) -> dict[str, Any]:
    """The wire form of a step's result (upstream's ``TaskOutput``): the worker's ``env_out``.

    A finished episode's metrics always carry ``score`` (upstream clients report it as ``metric_score``): the task's
    own (an F1, a partial reward) or else the reward.
    """
    metrics = result.metrics
    if result.status.finished and "score" not in metrics:
        metrics = {**metrics, "score": float(result.reward)}
    return {"messages": result.messages, "tools": result.tools, "status": result.status.value,
            "finish": result.status.finished, "reward": float(result.reward), "metric": metrics}


def _ended(status: SampleStatus) -> dict[str, Any]:
    return _output(StepResult(status=status))


async def _settled(task: asyncio.Future) -> None:
    """Wait until ``task`` is done; unlike ``await task``, never raise its exception or cancellation.

    Same as ``asyncio.wait([task])`` without its per-call sets and waiter bookkeeping (this runs per interact).
    """
    done = asyncio.get_running_loop().create_future()
    task.add_done_callback(lambda _: done.done() or done.set_result(None))
    await done


class Worker:
    """One task served over HTTP.

    Args:
        task: The task instance (already constructed; :meth:`start` calls its ``setup``).
        name: Task name announced to the controller.
        concurrency: Sessions served at once; one more start_sample is answered 406.
        threads: Threads running blocking task code (``SyncSession`` methods, ``run_blocking`` calls); more such
            calls at once wait their turn. Default: ``concurrency``; 1 for an engine that is not thread-safe across
            sessions.
        controller_url: Controller base URL (``http://host:port``); ``None`` runs standalone.
        token: Shared token required on our routes and sent to the controller.
        allow_no_token: Listen off loopback without a token (loudly logged; see :func:`~env_adapters.http.check_bind`).
        heartbeat_interval: Seconds between heartbeats.
        max_body_mb: Largest request body accepted (413 beyond), not counting the controller's envelope.
        health_timeout: Seconds a :meth:`~env_adapters.task.Task.healthy` check may run before the worker reports
            itself unhealthy.
        node: Where the worker runs (e.g. its Ray node), announced to the controller and shown by ``list_workers``.
    """

    def __init__(self, task: Task, *, name: str, concurrency: int = 32, threads: int | None = None,
                 controller_url: str | None = None, token: str | None = None,
                 heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL, max_body_mb: float = DEFAULT_MAX_BODY_MB,
                 health_timeout: float = DEFAULT_HEALTH_TIMEOUT, allow_no_token: bool = False,
                 node: str | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"worker concurrency must be >= 1, got {concurrency}")
        if threads is not None and threads < 1:
            raise ValueError(f"worker threads must be >= 1, got {threads}")
        self.task, self.name, self.concurrency, self.node = task, name, concurrency, node
        self.controller_url = controller_url.rstrip("/") if controller_url else None
        self.token, self.heartbeat_interval, self.max_body_mb = token, heartbeat_interval, max_body_mb
        self.health_timeout, self.allow_no_token = health_timeout, allow_no_token
        self.problem: str | None = None  # why the task is unhealthy, as of the last heartbeat; None when healthy
        self._check: asyncio.Task | None = None
        self._check_since = 0.0
        self.instance = uuid.uuid4().hex
        self._executor = ThreadPoolExecutor(threads or concurrency, thread_name_prefix=f"{name}-task")
        self._task_context = blocking_context(self._executor)  # task code runs in it: run_blocking finds the pool
        self.address: str | None = None
        self._slots: dict[int, _Slot] = {}
        self._indices: list[Index] = []
        self._index_set: set[Index] = set()
        self._server: HTTPServer | None = None
        self._http: HTTPClient | None = None
        self._heartbeat: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()
        self._stopped = False

    # ---- lifecycle ------------------------------------------------------------------------------

    def routes(self) -> dict[tuple[str, str], Handler]:
        """The HTTP routes, by method and path."""
        return {
            ("POST", "/api/start_sample"): self._start_sample,
            ("POST", "/api/interact"): self._interact,
            ("POST", "/api/cancel"): self._cancel,
            ("POST", "/api/cancel_with_notice"): self._cancel_with_notice,
            ("POST", "/api/cancel_all"): self._cancel_all,
            ("GET", "/api/get_indices"): self._get_indices,
            ("GET", "/api/get_sessions"): self._get_sessions,
            ("GET", "/api/worker_status"): self._worker_status,
            ("POST", "/api/sample_status"): self._sample_status,
        }

    async def start(self, host: str = "127.0.0.1", port: int = 0, address: str | None = None) -> str:
        """Set the task up, serve, start heartbeating; return the worker's API address (``http://h:p/api``)."""
        await self._in_task_context(self.task.setup())
        self._indices = list(self.task.indices())
        self._index_set = set(self._indices)
        self._server = HTTPServer(self.routes(), self.token, self.max_body_mb, slack_bytes=ENVELOPE_BYTES,
                                  allow_no_token=self.allow_no_token)
        bound = await self._server.start(host, port)
        self.address = address or f"http://{host}:{bound}/api"
        self._http = HTTPClient(headers=auth_headers(self.token), timeout=10)
        if self.controller_url:
            self._heartbeat = asyncio.create_task(self._heartbeat_loop())
        logger.info("worker %r (%s, concurrency %d) serving at %s", self.name, type(self.task).__name__,
                    self.concurrency, self.address)
        return self.address

    async def stop(self) -> None:
        """Stop heartbeating and serving, cancel (and close) every session, tear the task down (once)."""
        if self._stopped:
            return
        self._stopped = True
        if self._heartbeat:
            self._heartbeat.cancel()
        if self._check is not None:
            self._check.cancel()
            await _settled(self._check)
        # End sessions before closing the server: it waits for handlers, and those wait for their steps.
        await asyncio.gather(*(self._end(slot, SampleStatus.CANCELLED) for slot in list(self._slots.values())))
        if self._server:
            await self._server.close()
        await drain(list(self._background), SHUTDOWN_GRACE_S, "background task(s)")
        if self._http:
            await self._http.close()
        await self._in_task_context(self.task.teardown())
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _in_task_context(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run task code as an asyncio task in the context where :func:`run_blocking` uses our thread pool."""
        return self._task_context.run(asyncio.ensure_future, coro)

    async def _heartbeat_loop(self) -> None:
        url = f"{self.controller_url}/api/receive_heartbeat"
        ok = None
        while True:
            await self._poll_health()
            body = {"name": self.name, "address": self.address, "concurrency": self.concurrency,
                    "indices": self._indices, "instance": self.instance, "healthy": self.problem is None}
            if self.node is not None:
                body["node"] = self.node
            if self.problem is not None:
                body["problem"] = self.problem
            try:
                resp = await self._http.request("POST", url, orjson.dumps(body))
                now_ok = resp.status == 200
                problem = f"HTTP {resp.status}: {resp.body[:200].decode(errors='replace')}"
            except (ClientError, TimeoutError) as e:
                now_ok, problem = False, repr(e)
            if now_ok != ok:  # log transitions only, not every beat
                if now_ok:
                    logger.info("worker %r registered with controller %s", self.name, self.controller_url)
                else:
                    logger.warning("heartbeat to %s failed (%s); retrying every %.1fs", url, problem,
                                   self.heartbeat_interval)
                ok = now_ok
            await asyncio.sleep(self.heartbeat_interval)

    async def _poll_health(self) -> None:
        """Update :attr:`problem` from the task's health check, waiting for it only briefly (see module doc)."""
        if self._check is None:
            self._check, self._check_since = self._in_task_context(self.task.healthy()), time.monotonic()
        await asyncio.wait({self._check}, timeout=min(1.0, self.heartbeat_interval / 4))
        if self._check.done():
            check, self._check = self._check, None
            if check.cancelled():
                problem = "the health check was cancelled"
            elif check.exception() is not None:
                problem = f"the health check failed: {check.exception()!r}"
            else:
                problem = None if check.result() else f"task {type(self.task).__name__} reports itself unhealthy"
        elif time.monotonic() - self._check_since > self.health_timeout:
            problem = f"the health check has not answered for {time.monotonic() - self._check_since:.0f} s"
        else:
            return  # still running, within its time: the last answer stands
        if problem != self.problem:
            if problem is None:
                logger.info("worker %r is healthy again", self.name)
            else:
                logger.warning("worker %r is unhealthy: %s", self.name, problem)
            self.problem = problem

    # ---- session bookkeeping --------------------------------------------------------------------

    async def _run(self, slot: _Slot, work) -> dict[str, Any]:
        """Run ``work`` (a reset or step) so that a cancel can interrupt it; map its outcome to a task output."""
        slot.step = self._in_task_context(work)
        try:
            await _settled(slot.step)
        except asyncio.CancelledError:  # the caller went away (or the worker is stopping): the session is void
            self._spawn(self._end(slot, SampleStatus.CANCELLED))
            raise
        step, slot.step = slot.step, None
        if slot.ended or step.cancelled():
            return _ended(slot.status if slot.ended else SampleStatus.CANCELLED)
        exc = step.exception()
        if exc is None:
            out = _output(step.result())
        elif isinstance(exc, InvalidAction):
            logger.debug("session %d: invalid action: %s", slot.id, exc)
            out = _ended(SampleStatus.AGENT_INVALID_ACTION)
        elif isinstance(exc, EnvironmentLost):
            logger.warning("session %d (index %r): the environment lost it: %s", slot.id, slot.index, exc)
            out = _output(StepResult(status=SampleStatus.TASK_ERROR, metrics={ENV_LOST: str(exc)}))
        else:
            logger.error("session %d (index %r) failed: task error", slot.id, slot.index, exc_info=exc)
            out = _ended(SampleStatus.TASK_ERROR)
        if out["finish"]:
            await self._end(slot, SampleStatus(out["status"]))
        return out

    async def _end(self, slot: _Slot, status: SampleStatus) -> None:
        """End a session once: free its slot, interrupt its step, close it (errors logged, never raised)."""
        if slot.ended:
            return
        slot.ended, slot.status = True, status
        self._slots.pop(slot.id, None)
        if slot.step is not None and slot.step is not asyncio.current_task():
            slot.step.cancel()
            await _settled(slot.step)
        if slot.session is not None:
            try:
                await self._in_task_context(slot.session.close())
            except Exception:
                logger.exception("closing session %d failed", slot.id)

    def _slot(self, sid: int) -> _Slot:
        slot = self._slots.get(sid)
        if slot is None:
            raise HTTPError(400, f"unknown session {sid} (never started here, or already ended)")
        return slot

    # ---- routes ---------------------------------------------------------------------------------

    async def _start_sample(self, request: Request) -> Response:
        data = read_json(request)
        sid = body_session_id(data)
        index, custom_task = body_index(data), body_custom_task(data)
        if self._stopped:
            raise HTTPError(503, f"worker {self.name!r} is shutting down")
        if sid in self._slots:
            raise HTTPError(400, f"session {sid} already exists on this worker")
        if len(self._slots) >= self.concurrency:
            raise HTTPError(406, f"worker {self.name!r} is full ({self.concurrency} sessions)")
        if not (index == -1 and custom_task is not None) and index not in self._index_set:
            raise HTTPError(400, f"index {index!r} is not served by task {self.name!r} (see get_indices); "
                                 "use index -1 with a custom_task")
        try:  # as for messages (see _checked_step): no text that is not valid Unicode reaches task code
            orjson.dumps(custom_task)
        except orjson.JSONEncodeError as e:
            raise HTTPError(400, f"'custom_task' cannot be read: {e}") from e
        slot = self._slots[sid] = _Slot(sid, index)  # taken before any await: capacity holds under concurrency

        async def open_and_reset() -> StepResult:
            slot.session = await open_session(self.task, index, custom_task)
            return await slot.session.reset()

        out = await self._run(slot, open_and_reset())
        return json_response(out, headers={"session_id": str(sid)})

    async def _interact(self, request: Request) -> Response:
        data = read_json(request)
        sid = body_session_id(data)
        message = body_message(data)
        slot = self._slot(sid)
        if slot.step is not None:
            raise HTTPError(400, f"session {sid} is busy with another interact")
        out = await self._run(slot, _checked_step(slot.session, message))
        return json_response({"session_id": sid, "env_out": out})

    async def _cancel(self, request: Request) -> Response:
        return json_response(await self._cancel_session(body_session_id(read_json(request))))

    async def _cancel_with_notice(self, request: Request) -> Response:
        result = await self._cancel_session(body_session_id(read_json(request)))
        if self.controller_url:
            self._notify_cancel(result["session_id"])
        return json_response(result)

    async def _cancel_session(self, sid: int) -> dict[str, Any]:
        slot = self._slots.get(sid)
        if slot is not None:
            await self._end(slot, SampleStatus.CANCELLED)
        return {"session_id": sid, "cancelled": slot is not None}

    def _notify_cancel(self, sid: int) -> None:
        async def notice():
            try:
                await self._http.request("POST", f"{self.controller_url}/api/cancel_notice",
                                         orjson.dumps({"session_id": sid}))
            except (ClientError, TimeoutError) as e:
                logger.warning("cancel notice for session %d not delivered: %r", sid, e)

        self._spawn(notice())

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background (kept referenced until done; awaited at stop)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel_all(self, request: Request) -> Response:
        slots = list(self._slots.values())
        await asyncio.gather(*(self._end(slot, SampleStatus.CANCELLED) for slot in slots))
        return json_response({"cancelled": [slot.id for slot in slots]})

    async def _get_indices(self, request: Request) -> Response:
        return json_response(self._indices)

    async def _get_sessions(self, request: Request) -> Response:
        sessions = {str(sid): {"index": s.index, "busy": s.step is not None} for sid, s in self._slots.items()}
        return json_response(sessions)

    async def _worker_status(self, request: Request) -> Response:
        return json_response({"name": self.name, "concurrency": self.concurrency, "current": len(self._slots),
                              "instance": self.instance, "healthy": self.problem is None, "problem": self.problem})

    async def _sample_status(self, request: Request) -> Response:
        sid = body_session_id(read_json(request))
        slot = self._slot(sid)
        return json_response({"session_id": sid, "status": slot.status.value, "busy": slot.step is not None,
                              "age_s": time.monotonic() - slot.created})


# ---- CLI -----------------------------------------------------------------------------------------


def parse_options(pairs: list[str], config: str | None) -> dict[str, Any]:
    """Task options from a YAML file and ``key=value`` pairs (values parsed as YAML: ``5``, ``{dist: fixed}``)."""
    options: dict[str, Any] = {}
    if config:
        loaded = yaml.safe_load(Path(config).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"--config {config}: expected a mapping of task options, got {type(loaded).__name__}")
        options.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {pair!r}: expected key=value")
        options[key] = yaml.safe_load(value)
    return options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True,
                        help=f"task family ({', '.join(task_families())}) or package.module:ClassName")
    parser.add_argument("--name", help="task name announced to the controller (default: the family)")
    parser.add_argument("--controller", help="controller base URL, e.g. http://127.0.0.1:5020 (default: standalone)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=0, help="bind port (0: any free port)")
    parser.add_argument("--address", help="API address announced to the controller (default http://HOST:PORT/api)")
    parser.add_argument("--concurrency", type=int, default=32, help="sessions served at once")
    parser.add_argument("--node", help="where this worker runs (e.g. its Ray node id), shown by list_workers")
    parser.add_argument("--threads", type=int, help="threads for blocking task code (default: the concurrency)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="task option (repeatable)")
    parser.add_argument("--config", help="YAML file of task options")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"shared token (required on our routes, sent to the controller; required off loopback; "
                        f"default ${TOKEN_ENV}, which other users of the host cannot read as they can a command line)")
    parser.add_argument("--allow-no-token", action="store_true",
                        help="listen off loopback without a token (trusted networks only; logged loudly)")
    parser.add_argument("--heartbeat-interval", type=float, default=DEFAULT_HEARTBEAT_INTERVAL)
    parser.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_MB)
    parser.add_argument("--health-timeout", type=float, default=DEFAULT_HEALTH_TIMEOUT,
                        help="seconds the task's health check may run before the worker reports itself unhealthy")


def run(args: argparse.Namespace) -> int:
    try:
        options = parse_options(args.option, args.config)
        task = get_task_class(args.task)(**options)
    except (KeyError, TypeError, ValueError, OSError) as e:
        logger.error("cannot create task %r (options %s): %s", args.task, args.option or args.config or "none", e)
        return 2
    worker = Worker(task, name=args.name or args.task, concurrency=args.concurrency, threads=args.threads,
                    controller_url=args.controller,
                    token=args.token, heartbeat_interval=args.heartbeat_interval, max_body_mb=args.max_body_mb,
                    health_timeout=args.health_timeout, allow_no_token=args.allow_no_token, node=args.node)
    try:
        check_bind(args.host, args.token, args.allow_no_token)
    except InsecureBindError as e:
        logger.error("%s", e)
        return 2

    async def main(stop: asyncio.Event) -> None:
        try:
            await worker.start(args.host, args.port, args.address)
            await stop.wait()
        finally:
            logger.info("worker %r stopping", worker.name)
            await worker.stop()

    run_until_signal(main)
    return 0
