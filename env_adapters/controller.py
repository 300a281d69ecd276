"""Controller server: one front door for clients, dispatching sessions to the task workers.

Client face (AgentBench-FC, under ``/api``): ``POST start_sample`` (session id in the ``session_id`` response
header), ``POST interact`` / ``POST cancel`` (``session_id`` request header), ``GET get_indices?name=``,
``GET list_workers``, ``GET list_sessions``, ``POST cancel_all`` (optional ``name``).
Worker face: ``POST receive_heartbeat``, ``POST cancel_notice``. Operations: ``POST mark_stale``
(drain a worker), ``POST sync_all``, ``GET version``.

Behaviour (defaults as the upstream Go controller): a session goes to the alive, healthy, non-stale worker of its
task with the most free capacity; one interact at a time per session; a session idle ``session_idle_timeout`` is
cancelled; finished sessions are forgotten after ``finished_ttl``; a worker silent ``heartbeat_timeout`` is
marked dead (its sessions end with ``task error``) and forgotten after ``worker_remove_after``.

Deliberate extensions: start_sample waits up to ``start_wait`` seconds for capacity, then answers 503 with
``Retry-After`` (a "busy" the client retries); its body also carries ``status``/``finish``/``reward``/
``metrics`` when the task ended already at reset (e.g. ``task error``); heartbeats may carry an ``instance``
id so that a worker restarted on the same address has its old sessions ended at once, and ``healthy: false``
(with a ``problem``) from a worker whose task cannot serve (a dead backend): it gets no new sessions, keeps its
running ones, and is dispatched to again once a heartbeat says ``healthy: true``; errors are
``{"detail": ...}`` with 404 for an unknown session or task and 409 for a finished or busy session.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from env_adapters import __version__
from env_adapters.http import (
    DEFAULT_MAX_BODY_MB,
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
    dumps,
    json_response,
    read_json,
    run_until_signal,
    session_id_header,
)
from env_adapters.protocol import ENV_LOST, SampleStatus

logger = logging.getLogger(__name__)

DEFAULT_PORT = 5020
MAX_CANCELS_IN_FLIGHT = 64
PAUSE_LOGGED_S = 1.0
"""A sweep this late is logged as the controller's own pause (shorter delays are excused silently)."""
_TERMINAL = {s.value: s for s in SampleStatus}


@dataclass
class ControllerConfig:
    """Timeouts (seconds) and limits of the controller; defaults follow the upstream controller.

    Attributes:
        session_idle_timeout: A session without interact for this long is cancelled.
        finished_ttl: A finished session is forgotten after this long (interact then answers 404).
        interact_timeout: Longest a worker may take for one interact (or a start_sample) before the session
            ends with ``task error``.
        clean_interval: Period of the expiry sweep.
        heartbeat_timeout: A worker silent this long is dead; its sessions end with ``task error``.
        worker_remove_after: A dead worker is forgotten after this long.
        start_wait: Longest start_sample waits for a free slot before answering 503 (busy).
        max_body_mb: Largest request body accepted (413 beyond).
    """

    session_idle_timeout: float = 300.0
    finished_ttl: float = 600.0
    interact_timeout: float = 240.0
    clean_interval: float = 20.0
    heartbeat_timeout: float = 11.0
    worker_remove_after: float = 300.0
    start_wait: float = 30.0
    max_body_mb: float = DEFAULT_MAX_BODY_MB


@dataclass(eq=False)
class WorkerEntry:
    id: int
    name: str
    address: str
    concurrency: int
    indices: list[Any]
    instance: str | None
    last_seen: float
    alive: bool = True
    stale: bool = False
    problem: str | None = None  # why the worker's task is unhealthy, as its last heartbeat said; None when healthy
    node: str | None = None  # where it runs, as it says (our launchers name the Ray node); absent upstream
    sessions: set[int] = field(default_factory=set)  # running (or starting) sessions placed here
    cancelling: set[int] = field(default_factory=set)  # ended here, still held there until our cancel arrives
    # Set while the worker is declared down: releases the requests still waiting on it (a frozen worker keeps its
    # connections open, so they would otherwise wait for their full timeout).
    down: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def free(self) -> int:
        return self.concurrency - len(self.sessions) - len(self.cancelling)

    def describe(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "address": self.address, "concurrency": self.concurrency,
                "current": len(self.sessions), "alive": self.alive, "stale": self.stale,
                "healthy": self.problem is None, "problem": self.problem, "node": self.node,
                "last_heartbeat_s": round(now - self.last_seen, 3)}


@dataclass(eq=False)
class SessionEntry:
    id: int
    name: str
    worker: WorkerEntry
    last_active: float
    status: SampleStatus = SampleStatus.RUNNING
    busy: bool = False
    reward: float = 0.0
    finished_at: float | None = None
    lost: str | None = None  # why its worker went, when that ended it: the episode was not the agent's to lose


class _WorkerGone(Exception):
    """The worker did not answer (connection refused/reset, or timeout)."""


class Controller:
    """The controller's state and routes. Single event loop; no locks needed, as no state change awaits."""

    def __init__(self, config: ControllerConfig | None = None, token: str | None = None,
                 allow_no_token: bool = False) -> None:
        self.config = config or ControllerConfig()
        self.token, self.allow_no_token = token, allow_no_token
        self.workers: dict[int, WorkerEntry] = {}
        self.sessions: dict[int, SessionEntry] = {}
        self._by_address: dict[tuple[str, str], WorkerEntry] = {}
        # Session ids of one controller never repeat those of an earlier one on the same address (a restart): its
        # workers and clients may still hold the old ones. Microseconds since the epoch stay below 2**53 (exact as
        # JSON numbers everywhere) for centuries, and no controller starts sessions a million a second.
        self._session_ids = itertools.count(time.time_ns() // 1000)
        self._worker_ids = itertools.count(1)
        self._waiters: dict[str, deque[asyncio.Future]] = {}
        self._background: set[asyncio.Task] = set()
        # A cancel_all of thousands of sessions sends as many cancels: a few keep-alive connections carry
        # them in turn rather than one new connection each.
        self._cancel_gate = asyncio.Semaphore(MAX_CANCELS_IN_FLIGHT)
        self._http: HTTPClient | None = None
        self._server: HTTPServer | None = None
        self._cleaner: asyncio.Task | None = None
        self._stopped = False

    # ---- lifecycle ------------------------------------------------------------------------------

    def routes(self) -> dict[tuple[str, str], Handler]:
        """The HTTP routes, by method and path."""
        return {
            ("POST", "/api/start_sample"): self._start_sample,
            ("POST", "/api/interact"): self._interact,
            ("POST", "/api/cancel"): self._cancel,
            ("GET", "/api/get_indices"): self._get_indices,
            ("GET", "/api/list_workers"): self._list_workers,
            ("GET", "/api/list_sessions"): self._list_sessions,
            ("POST", "/api/cancel_all"): self._cancel_all,
            ("POST", "/api/receive_heartbeat"): self._receive_heartbeat,
            ("POST", "/api/cancel_notice"): self._cancel_notice,
            ("POST", "/api/mark_stale"): self._mark_stale,
            ("POST", "/api/sync_all"): self._sync_all,
            ("GET", "/api/version"): self._version,
        }

    async def start(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> str:
        """Serve and start the expiry sweep; return the base URL (``http://host:port``)."""
        # No connection cap towards workers: their own concurrency bounds the requests in flight.
        self._http = HTTPClient(headers=auth_headers(self.token))
        self._server = HTTPServer(self.routes(), self.token, self.config.max_body_mb,
                                  allow_no_token=self.allow_no_token)
        bound = await self._server.start(host, port)
        self._cleaner = asyncio.create_task(self._clean_loop())
        url = f"http://{host}:{bound}"
        logger.info("controller serving at %s", url)
        return url

    async def stop(self) -> None:
        """Stop serving and sweeping (idempotent); sessions are left to the workers' own shutdown."""
        if self._stopped:
            return
        self._stopped = True
        if self._cleaner:
            self._cleaner.cancel()
        if self._server:
            await self._server.close()
        await drain(list(self._background), SHUTDOWN_GRACE_S, "cancel(s) to workers")
        if self._http:
            await self._http.close()

    # ---- talking to workers ---------------------------------------------------------------------

    async def _post(self, worker: WorkerEntry, route: str, body: dict[str, Any], timeout: float) -> tuple[int, Any]:
        try:
            resp = await self._http.request("POST", f"{worker.address}/{route}", dumps(body), timeout=timeout)
        except (ClientError, TimeoutError) as e:
            raise _WorkerGone(f"worker {worker.id} ({worker.address}) {route}: {e!r}") from e
        try:
            return resp.status, resp.json()
        except orjson.JSONDecodeError:
            return resp.status, {"detail": resp.body[:500].decode(errors="replace")}

    async def _post_while_up(self, worker: WorkerEntry, route: str, body: dict[str, Any],
                             timeout: float) -> tuple[int, Any]:
        """:meth:`_post`, given up as soon as ``worker`` is declared down (by its missed heartbeats or another
        request's failure), so that no caller waits on a frozen worker beyond that."""
        post = asyncio.ensure_future(self._post(worker, route, body, timeout))
        down = asyncio.ensure_future(worker.down.wait())
        try:
            done, _ = await asyncio.wait({post, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            down.cancel()
            if not post.done():
                post.cancel()
        if post in done:
            return post.result()
        raise _WorkerGone(f"worker {worker.id} ({worker.address}) {route}: no answer before it was declared down")

    def _fire(self, coro) -> None:
        """Run ``coro`` in the background (kept referenced until done)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _cancel_on_worker(self, worker: WorkerEntry, sid: int) -> None:
        """Cancel ``sid`` on ``worker`` in the background, once; its slot counts as taken until the worker has it."""
        if sid in worker.cancelling:
            return
        worker.cancelling.add(sid)
        self._fire(self._send_cancel(worker, sid))

    async def _send_cancel(self, worker: WorkerEntry, sid: int) -> None:
        try:
            async with self._cancel_gate:
                await self._post(worker, "cancel", {"session_id": sid}, timeout=10)
        except _WorkerGone as e:
            logger.debug("cancel of session %d not delivered: %s", sid, e)
        finally:
            worker.cancelling.discard(sid)
            self._wake(worker.name)

    async def _resync(self, worker: WorkerEntry) -> None:
        """Reconcile our view of a worker's sessions with its own: end ours it lost, cancel its orphans."""
        # Only sessions placed before the snapshot can be missing from it; later ones are simply not in it yet.
        placed = {sid for sid in worker.sessions if sid in self.sessions}
        try:
            r = await self._http.request("GET", f"{worker.address}/get_sessions", timeout=10)
            theirs = {int(sid) for sid in r.json()} if r.status == 200 else None
        except (ClientError, TimeoutError, orjson.JSONDecodeError, ValueError) as e:
            logger.warning("re-sync of worker %d failed: %r", worker.id, e)
            return
        if theirs is None:
            return
        for sid in placed - theirs:
            s = self.sessions.get(sid)
            if s is not None and s.worker is worker and not s.busy:
                self._end(s, SampleStatus.TASK_ERROR)
        for sid in theirs - worker.sessions - worker.cancelling:
            self._cancel_on_worker(worker, sid)

    # ---- bookkeeping ----------------------------------------------------------------------------

    def _end(self, s: SessionEntry, status: SampleStatus, reward: float = 0.0) -> bool:
        """Mark a running session finished and free its worker slot; False if it had ended already."""
        if s.status is not SampleStatus.RUNNING:
            return False
        s.status, s.reward, s.finished_at = status, reward, time.monotonic()
        s.worker.sessions.discard(s.id)
        self._wake(s.name)
        return True

    def _worker_down(self, worker: WorkerEntry, reason: str) -> None:
        """A worker is dead: end its sessions with ``task error`` now (no client waits for a timeout)."""
        if worker.alive:
            logger.warning("worker %d (%s, %s) is down: %s; ending its %d session(s)", worker.id, worker.name,
                           worker.address, reason, len(worker.sessions))
        worker.alive = False
        worker.down.set()
        for sid in list(worker.sessions):
            s = self.sessions.get(sid)
            if s is not None and self._end(s, SampleStatus.TASK_ERROR):
                s.lost = f"worker {worker.id} ({worker.address}) down: {reason}"
        worker.sessions.clear()

    def _pick(self, name: str) -> WorkerEntry | None:
        best = None
        for w in self.workers.values():
            if (w.name == name and w.alive and w.problem is None and not w.stale and w.free > 0
                    and (best is None or w.free > best.free)):
                best = w
        return best

    def _wake(self, name: str, everyone: bool = False) -> None:
        """Tell start_sample callers waiting for ``name`` that capacity may be free (one per freed slot)."""
        waiters = self._waiters.get(name)
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                if not everyone:
                    return

    async def _acquire(self, name: str, deadline: float) -> WorkerEntry:
        while True:
            worker = self._pick(name)
            if worker is not None:
                return worker
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                unhealthy = [w for w in self.workers.values() if w.name == name and w.alive and w.problem is not None]
                why = (f"; {len(unhealthy)} unhealthy worker(s) get no new sessions (e.g. {unhealthy[0].problem})"
                       if unhealthy else "")
                raise HTTPError(503, f"busy: all workers of task {name!r} are at capacity{why}; retry later",
                                headers={"Retry-After": "1"})
            fut = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(name, deque()).append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass

    def _known_task(self, name: Any) -> str:
        if not isinstance(name, str) or not any(w.name == name for w in self.workers.values()):
            known = sorted({w.name for w in self.workers.values()})
            raise HTTPError(404, f"unknown task {name!r}: no worker registered it; known tasks: {known}")
        return name

    def _session(self, sid: int) -> SessionEntry:
        s = self.sessions.get(sid)
        if s is None:
            raise HTTPError(404, f"unknown session {sid} (never started, or finished more than "
                                 f"{self.config.finished_ttl:.0f}s ago)")
        return s

    # ---- client face ----------------------------------------------------------------------------

    async def _start_sample(self, request: Request) -> Response:
        data = read_json(request)
        name = self._known_task(data.get("name"))
        body = {"index": body_index(data), "custom_task": body_custom_task(data), "session_id": 0}
        deadline = time.monotonic() + self.config.start_wait
        while True:
            worker = await self._acquire(name, deadline)
            sid = body["session_id"] = next(self._session_ids)
            worker.sessions.add(sid)  # reserve before awaiting, so concurrent starts see the slot taken
            try:
                status, out = await self._post_while_up(worker, "start_sample", body, self.config.interact_timeout)
            except asyncio.CancelledError:  # the client went away: the session it will never learn of must go
                worker.sessions.discard(sid)
                self._cancel_on_worker(worker, sid)  # the slot frees (and a waiter wakes) once the worker has it
                raise
            except _WorkerGone as e:
                worker.sessions.discard(sid)
                self._cancel_on_worker(worker, sid)
                self._worker_down(worker, str(e))
                continue  # try another worker
            if status == 503:  # shutting down
                worker.sessions.discard(sid)
                self._worker_down(worker, "shutting down")
                continue
            if status == 406:  # the worker is fuller than we thought: re-sync and try elsewhere
                worker.sessions.discard(sid)
                await self._resync(worker)
                continue
            if status != 200:
                worker.sessions.discard(sid)
                self._wake(name)
                raise HTTPError(status if 400 <= status < 500 else 502,
                                f"worker {worker.id} refused start_sample: {out.get('detail', out)}")
            break
        now = time.monotonic()
        s = self.sessions[sid] = SessionEntry(sid, name, worker, now)
        answer = {"messages": out.get("messages", []), "tools": out.get("tools") or []}
        status = _TERMINAL.get(out.get("status"), SampleStatus.TASK_ERROR)
        if status is not SampleStatus.RUNNING or not worker.alive:
            self._end(s, status if worker.alive else SampleStatus.TASK_ERROR, float(out.get("reward", 0.0)))
            answer.update(status=s.status.value, finish=True, reward=s.reward, metrics=out.get("metric", {}))
        return json_response(answer, headers={"session_id": str(sid)})

    async def _interact(self, request: Request) -> Response:
        s = self._session(session_id_header(request))
        if s.status is not SampleStatus.RUNNING:
            raise HTTPError(409, f"session {s.id} already finished with status {s.status.value!r}")
        if s.busy:
            raise HTTPError(409, f"session {s.id} already has an interact in flight; send one at a time")
        message = body_message(read_json(request))
        s.busy = True
        s.last_active = time.monotonic()
        worker = s.worker
        try:
            status, out = await self._post_while_up(worker, "interact", {"session_id": s.id, "messages": [message]},
                                                    self.config.interact_timeout)
        except asyncio.CancelledError:  # the client went away mid-step: the episode cannot go on
            if self._end(s, SampleStatus.CANCELLED):
                self._cancel_on_worker(worker, s.id)
            raise
        except _WorkerGone as e:
            out = None
            await self._on_interact_failure(s, str(e))
        finally:
            s.busy = False
            s.last_active = time.monotonic()
        if out is not None:
            env_out = out.get("env_out") if status == 200 else None
            if env_out is None:
                logger.warning("session %d: worker %d answered interact with HTTP %d: %s; ending it", s.id,
                               worker.id, status, out.get("detail", out))
                self._end(s, SampleStatus.TASK_ERROR)
            else:
                new_status = _TERMINAL.get(env_out.get("status"), SampleStatus.TASK_ERROR)
                if new_status is SampleStatus.RUNNING and not env_out.get("messages"):
                    logger.warning("session %d: worker answered 'running' without messages; ending it", s.id)
                    new_status = SampleStatus.TASK_ERROR
                    self._cancel_on_worker(worker, s.id)
                if new_status is not SampleStatus.RUNNING:
                    self._end(s, new_status, float(env_out.get("reward", 0.0)))
                if s.status is not new_status:  # cancelled or failed while the step ran: report that
                    return self._finished_answer(s)
                return json_response({"finish": new_status is not SampleStatus.RUNNING,
                                      "reward": float(env_out.get("reward", 0.0)), "status": new_status.value,
                                      "messages": env_out.get("messages", []), "metrics": env_out.get("metric", {})})
        return self._finished_answer(s)

    @staticmethod
    def _finished_answer(s: SessionEntry) -> Response:
        # ``env_lost`` (an extension; upstream clients ignore metrics they do not know) tells a trainer that the
        # environment, not the agent, ended the episode, so that it may play it again.
        return json_response({"finish": True, "reward": s.reward, "status": s.status.value, "messages": [],
                              "metrics": {ENV_LOST: s.lost} if s.lost else {}})

    async def _on_interact_failure(self, s: SessionEntry, reason: str) -> None:
        """The worker did not answer: if it is gone, end all its sessions; else end this one (and cancel it)."""
        worker = s.worker
        if not worker.alive:  # declared down while this interact waited: its sessions have ended
            return
        try:
            reachable = (await self._http.request("GET", f"{worker.address}/worker_status", timeout=2)).status == 200
        except (ClientError, TimeoutError):
            reachable = False
        if reachable:
            logger.warning("session %d: %s; ending it with task error", s.id, reason)
            self._end(s, SampleStatus.TASK_ERROR)
            self._cancel_on_worker(worker, s.id)
        else:
            self._worker_down(worker, reason)

    async def _cancel(self, request: Request) -> Response:
        s = self._session(session_id_header(request))
        if self._end(s, SampleStatus.CANCELLED):
            self._cancel_on_worker(s.worker, s.id)
        return json_response({"session_id": s.id, "status": s.status.value})

    async def _cancel_all(self, request: Request) -> Response:
        data = read_json(request) if request.body else {}
        name = data.get("name")
        cancelled = []
        for s in list(self.sessions.values()):
            if (name is None or s.name == name) and self._end(s, SampleStatus.CANCELLED):
                self._cancel_on_worker(s.worker, s.id)
                cancelled.append(s.id)
        return json_response({"cancelled": cancelled})

    async def _get_indices(self, request: Request) -> Response:
        name = self._known_task(request.query.get("name"))
        worker = max((w for w in self.workers.values() if w.name == name), key=lambda w: w.last_seen)
        return json_response(worker.indices)

    async def _list_workers(self, request: Request) -> Response:
        now = time.monotonic()
        by_task: dict[str, dict[str, Any]] = {}
        for w in self.workers.values():
            by_task.setdefault(w.name, {})[str(w.id)] = w.describe(now)
        return json_response(by_task)

    async def _list_sessions(self, request: Request) -> Response:
        now = time.monotonic()
        return json_response({str(s.id): {"name": s.name, "worker_id": s.worker.id, "status": s.status.value,
                                          "busy": s.busy, "idle_s": round(now - s.last_active, 3)}
                              for s in self.sessions.values()})

    # ---- worker face ----------------------------------------------------------------------------

    async def _receive_heartbeat(self, request: Request) -> Response:
        data = read_json(request)
        name, address, concurrency = data.get("name"), data.get("address"), data.get("concurrency")
        if not isinstance(name, str) or not isinstance(address, str) or not isinstance(concurrency, int):
            raise HTTPError(400, "heartbeat needs 'name' (str), 'address' (str) and 'concurrency' (int)")
        healthy = data.get("healthy", True)  # absent from upstream workers' heartbeats
        if not isinstance(healthy, bool):
            raise HTTPError(400, f"heartbeat 'healthy' must be true or false, got {healthy!r}")
        instance, now = data.get("instance"), time.monotonic()
        worker = self._by_address.get((name, address.rstrip("/")))
        if worker is not None and (not worker.alive or (instance is not None and instance != worker.instance)):
            # A restarted worker knows none of the sessions we placed there before.
            self._worker_down(worker, "restarted")
            logger.info("worker %d (%s, %s) is back", worker.id, name, address)
            worker.alive, worker.instance = True, instance
            worker.down.clear()
            self._fire(self._resync(worker))
        if worker is None:
            worker = WorkerEntry(next(self._worker_ids), name, address.rstrip("/"), concurrency,
                                 data.get("indices") or [], instance, now)
            self.workers[worker.id] = self._by_address[(name, worker.address)] = worker
            logger.info("worker %d registered: task %r at %s, concurrency %d", worker.id, name, address, concurrency)
        node = data.get("node")
        worker.last_seen, worker.concurrency, worker.node = now, concurrency, node if isinstance(node, str) else None
        problem = None if healthy else str(data.get("problem") or "the worker reports itself unhealthy")
        if problem != worker.problem:
            if problem is None:
                logger.info("worker %d (%s, %s) is healthy again", worker.id, name, address)
            else:
                logger.warning("worker %d (%s, %s) is unhealthy, no new sessions go there: %s", worker.id, name,
                               address, problem)
            worker.problem = problem
        worker.indices = data.get("indices") or worker.indices
        self._wake(name, everyone=True)
        return json_response({"worker_id": worker.id})

    async def _cancel_notice(self, request: Request) -> Response:
        s = self.sessions.get(body_session_id(read_json(request)))
        if s is not None:
            self._end(s, SampleStatus.CANCELLED)
        return json_response({"ok": True})

    # ---- operations -----------------------------------------------------------------------------

    async def _mark_stale(self, request: Request) -> Response:
        data = read_json(request)
        worker = self.workers.get(data.get("worker_id"))
        if worker is None or ("name" in data and data["name"] != worker.name):
            raise HTTPError(404, f"no worker {data.get('worker_id')!r} of task {data.get('name')!r} (see list_workers)")
        worker.stale = bool(data.get("stale", True))
        if not worker.stale:
            self._wake(worker.name, everyone=True)
        return json_response(worker.describe(time.monotonic()))

    async def _sync_all(self, request: Request) -> Response:
        alive = [w for w in self.workers.values() if w.alive]
        await asyncio.gather(*(self._resync(w) for w in alive))
        return json_response({"synced": [w.id for w in alive]})

    async def _version(self, request: Request) -> Response:
        return json_response({"version": __version__, "implementation": "agentrl-env", "protocol": "agentbench-fc"})

    # ---- expiry ---------------------------------------------------------------------------------

    def sweep(self, now: float | None = None) -> None:
        """Expire idle sessions, forget old finished ones, detect silent workers (runs every clean_interval)."""
        now = time.monotonic() if now is None else now
        cfg = self.config
        for w in list(self.workers.values()):
            if w.alive and now - w.last_seen > cfg.heartbeat_timeout:
                self._worker_down(w, f"no heartbeat for {now - w.last_seen:.1f}s")
            if not w.alive and now - w.last_seen > cfg.worker_remove_after:
                del self.workers[w.id]
                self._by_address.pop((w.name, w.address), None)
        for s in list(self.sessions.values()):
            if s.status is SampleStatus.RUNNING:
                if not s.busy and now - s.last_active > cfg.session_idle_timeout:
                    logger.info("session %d idle for %.0fs: cancelled", s.id, now - s.last_active)
                    self._end(s, SampleStatus.CANCELLED)
                    self._cancel_on_worker(s.worker, s.id)
            elif now - s.finished_at > cfg.finished_ttl:
                del self.sessions[s.id]

    def excuse_pause(self, seconds: float, now: float) -> None:
        """Count ``seconds`` during which the controller did not run (stopped, or its loop starved) against no one:
        the workers' heartbeats and the sessions' idle times are moved on by as much (never past ``now``). After a
        pause the sweep runs before the heartbeats queued meanwhile are read; without this it would find every
        worker silent and end every running session."""
        if seconds >= PAUSE_LOGGED_S:
            logger.warning("the controller did not run for %.1fs (stopped or starved): that time counts against no "
                           "worker's heartbeat and no session's idle time", seconds)
        for w in self.workers.values():
            w.last_seen = min(w.last_seen + seconds, now)
        for s in self.sessions.values():
            if s.status is SampleStatus.RUNNING:
                s.last_active = min(s.last_active + seconds, now)

    async def _clean_loop(self) -> None:
        due = time.monotonic() + self.config.clean_interval
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            if now > due:
                self.excuse_pause(now - due, now)
            self.sweep(now)
            due = now + self.config.clean_interval


# ---- CLI -----------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="bind port (0: any free port)")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"shared token required on every route (required off loopback; default ${TOKEN_ENV}, "
                        "which other users of the host cannot read as they can a command line)")
    parser.add_argument("--allow-no-token", action="store_true",
                        help="listen off loopback without a token (trusted networks only; logged loudly)")
    parser.add_argument("--url-file", help="write the controller's URL to this file once it serves")
    for f in fields(ControllerConfig):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=float, default=f.default,
                            help=f"(default {f.default})")


def run(args: argparse.Namespace) -> int:
    config = ControllerConfig(**{f.name: getattr(args, f.name) for f in fields(ControllerConfig)})
    controller = Controller(config, token=args.token, allow_no_token=args.allow_no_token)
    try:
        check_bind(args.host, args.token, args.allow_no_token)
    except InsecureBindError as e:
        logger.error("%s", e)
        return 2

    async def main(stop: asyncio.Event) -> None:
        try:
            url = await controller.start(args.host, args.port)
            if args.url_file:
                Path(args.url_file).write_text(url)
            logger.info("controller config: %s", asdict(config))
            await stop.wait()
        finally:
            await controller.stop()

    run_until_signal(main)
    return 0
