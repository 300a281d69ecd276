"""A lean HTTP/1.1 layer for the controller, the workers and the client: asyncio protocols + httptools.

Why not a framework: an interact crosses two HTTP hops (client -> controller -> worker), and with aiohttp's
server and client the controller spent several hundred microseconds of CPU per interact in request/response
objects, middlewares, timers and stream readers. Here a request is parsed by httptools (the C parser uvicorn
uses) straight into a small :class:`Request`, handlers return a :class:`Response` of ready bytes, and the client
keeps a pool of keep-alive connections, each a protocol that parses the reply in C as it arrives.

Server: routes are ``{(method, path): handler}``; errors are answered as ``{"detail": "..."}`` like the upstream
FastAPI worker (400 malformed, 401 token, 404 route, 405 method, 408 request not received in time, 413 body too
large, 500 handler bug), so that one client code path reads every error. Requests on one connection are answered in
order (pipelining allowed). When the client goes away, the handler still running for it is cancelled: handlers
undo what their caller will never learn of (a started session, a step in flight).

Client: :class:`HTTPClient` raises :class:`ConnectError` when no connection could be opened (the server cannot
have acted: always safe to retry), :class:`ServerDisconnectedError` when the connection broke before the full
reply, and ``TimeoutError``. JSON goes through orjson everywhere.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import os
import secrets
import signal
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from functools import lru_cache
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httptools
import orjson

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_MB = 4.0
KEEPALIVE_TIMEOUT_S = 75.0  # server side: an idle connection is closed after this long
REQUEST_READ_TIMEOUT_S = 30.0  # server side: a request must arrive whole (head and body) within this long
# Room for what the controller adds to a client's body when it forwards it to a worker (session id, field names):
# a worker accepts this much beyond its max_body_mb, so a body just under the controller's limit passes the hop.
ENVELOPE_BYTES = 4096
CLIENT_IDLE_S = 15.0  # client side: well below the server's, so a pooled connection is never reused as it closes
# Shutdown budget per stage (requests in flight, then background notices): together well inside the
# launcher's 10 s between SIGTERM and SIGKILL.
SHUTDOWN_GRACE_S = 2.0
_PIPELINE_DEPTH = 32  # queued requests on one connection before it stops reading

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


# ---- messages ------------------------------------------------------------------------------------


class HTTPError(Exception):
    """Raised by a handler to answer ``status`` with ``{"detail": detail}``."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers


class Request:
    """A received request: ``headers`` has lower-case names; ``query`` is parsed on first use."""

    __slots__ = ("method", "path", "raw_query", "headers", "body", "_query")

    def __init__(self, method: str, path: str, raw_query: str, headers: dict[str, str], body: bytes) -> None:
        self.method, self.path, self.raw_query, self.headers, self.body = method, path, raw_query, headers, body
        self._query: dict[str, str] | None = None

    @property
    def query(self) -> dict[str, str]:
        if self._query is None:
            self._query = dict(parse_qsl(self.raw_query))
        return self._query


class Response:
    """A reply to send: status, body bytes and extra headers (``Content-Type`` is JSON unless given)."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers

    def encode(self, keep_alive: bool) -> bytes:
        head = [b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n" % (self.status, _REASONS.get(self.status, b""),
                                                                   len(self.body))]
        if not self.headers or "Content-Type" not in self.headers:
            head.append(b"Content-Type: application/json\r\n")
        if self.headers:
            head.extend(f"{k}: {v}\r\n".encode("latin-1") for k, v in self.headers.items())
        if not keep_alive:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        head.append(self.body)
        return b"".join(head)


def dumps(data: Any) -> bytes:
    """``data`` as JSON bytes (orjson). Text that is not valid Unicode (a lone UTF-16 surrogate, which a model's
    tool-call JSON can spell) goes out escaped (``\\ud800``) instead of failing here: the receiver decides."""
    try:
        return orjson.dumps(data)
    except orjson.JSONEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` serialised with orjson as the reply body."""
    return Response(status, orjson.dumps(data), headers)


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> Response:
    return Response(status, orjson.dumps({"detail": detail}), headers)


def read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong."""
    try:
        data = orjson.loads(request.body)
    except orjson.JSONDecodeError as e:
        try:  # orjson refuses escapes of lone surrogates, which are valid JSON: the handler decides about them
            data = json.loads(request.body, parse_constant=_no_constants)
        except ValueError:
            raise HTTPError(400, f"request body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise HTTPError(400, f"request body must be a JSON object, got {type(data).__name__}")
    return data


def session_id_header(request: Request) -> int:
    """The ``session_id`` request header as an int, or a 400 naming the problem."""
    raw = request.headers.get("session_id")
    if raw is None:
        raise HTTPError(400, "missing 'session_id' header")
    try:
        return int(raw)
    except ValueError as e:
        raise HTTPError(400, f"'session_id' header must be an integer, got {raw!r}") from e


def body_session_id(data: dict[str, Any]) -> int:
    """The integer ``session_id`` of a request body, or a 400 naming the problem."""
    sid = data.get("session_id")
    if isinstance(sid, bool) or not isinstance(sid, int):
        raise HTTPError(400, f"body must carry an integer 'session_id', got {sid!r}")
    return sid


def body_index(data: dict[str, Any]) -> int | str:
    """The sample ``index`` of a start_sample body (default -1): an integer or a string, or a 400."""
    index = data.get("index", -1)
    if isinstance(index, bool) or not isinstance(index, int | str):
        raise HTTPError(400, f"'index' must be an integer or a string (see get_indices), got {index!r} "
                             f"({type(index).__name__})")
    return index


def body_custom_task(data: dict[str, Any]) -> dict[str, Any] | None:
    """The ``custom_task`` of a start_sample body: an object or absent/null, or a 400."""
    custom_task = data.get("custom_task")
    if custom_task is not None and not isinstance(custom_task, dict):
        raise HTTPError(400, f"'custom_task' must be an object or null, got {type(custom_task).__name__}")
    return custom_task


def body_message(data: dict[str, Any]) -> dict[str, Any]:
    """The one assistant message of an interact body (``{"messages": [message]}``), or a 400."""
    messages = data.get("messages")
    if not isinstance(messages, list) or len(messages) != 1 or not isinstance(messages[0], dict):
        raise HTTPError(400, "'messages' must be a list with exactly one assistant message object")
    return messages[0]


TOKEN_ENV = "AGENTRL_ENV_TOKEN"
"""The shared token of ``agentrl-env controller`` and ``worker`` when ``--token`` is not given. The stack launchers
pass it this way: a command line is visible to every user of the host (``ps``), a process's environment only to its
owner."""


def auth_headers(token: str | None) -> dict[str, str]:
    """The ``Authorization`` header for a shared token (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


# ---- server --------------------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]


def read_token_file(path: str | os.PathLike) -> str:
    """The token kept in the file ``path`` (surrounding whitespace stripped).

    Raises:
        ValueError: the file is missing, unreadable or empty (the message says how to make one).
    """
    file = Path(path).expanduser()
    try:
        token = file.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ValueError(f"cannot read the token file {file}: {e.strerror}; `agentrl-env up` writes one where its "
                         "stack YAML names it (controller.token_file), or make one readable on every node") from e
    if not token:
        raise ValueError(f"the token file {file} is empty")
    return token


def ensure_token_file(path: str | os.PathLike) -> str:
    """The token in ``path``; where the file does not exist, a new random one written there (mode 0600)."""
    file = Path(path).expanduser()
    if not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
        logger.info("wrote a new environment token to %s (give the training side agentrl.env.token_file=%s)",
                    file, file)
    return read_token_file(file)


class InsecureBindError(ValueError):
    """A server was asked to listen off loopback without a token."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) reaches this machine's loopback interface only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def check_bind(host: str, token: str | None, allow_no_token: bool = False) -> None:
    """Refuse to listen on ``host`` without a token unless it is loopback, or the caller opted out.

    Anyone who can reach an open controller or worker can start sessions, and in the ``os`` task run shell commands
    in its containers: off loopback, a token is the only gate.

    Raises:
        InsecureBindError: ``host`` is not loopback, ``token`` is empty and ``allow_no_token`` is false.
    """
    if token or is_loopback(host):
        return
    if not allow_no_token:
        raise InsecureBindError(
            f"refusing to listen on {host!r} without a token: anyone who can reach that address could start "
            f"sessions and run commands in task containers. Set a token (${TOKEN_ENV} or --token; `controller.token` "
            "in a stack YAML, with `agentrl.env.token` on the training side), bind 127.0.0.1, or, on a trusted network "
            "only, pass --allow-no-token (`controller.allow_no_token: true`)")
    logger.warning("listening on %s WITHOUT A TOKEN (--allow-no-token): anyone who can reach it can start sessions "
                   "and run commands in task containers; use this on a trusted network only", host)


class HTTPServer:
    """Serve ``routes`` (``{("POST", "/api/interact"): handler}``) with an optional shared token and body limit.

    Args:
        routes: Handlers by method and path.
        token: When set, every request must carry ``Authorization: Bearer <token>`` (else 401).
        max_body_mb: Largest request body accepted (413 beyond).
        slack_bytes: Accepted beyond ``max_body_mb`` (a worker's :data:`ENVELOPE_BYTES`).
        allow_no_token: Listen off loopback without a token (loudly logged; see :func:`check_bind`).
    """

    def __init__(self, routes: dict[tuple[str, str], Handler], token: str | None = None,
                 max_body_mb: float = DEFAULT_MAX_BODY_MB, slack_bytes: int = 0, allow_no_token: bool = False) -> None:
        self.routes = routes
        self.token, self.allow_no_token = token, allow_no_token
        self._paths = {path for _, path in routes}
        self._expected_auth = f"Bearer {token}".encode() if token else None
        self.max_body = int(max_body_mb * 2**20) + slack_bytes
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_ServerProtocol] = set()
        self.closing = False

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); return the bound port.

        Raises:
            InsecureBindError: ``host`` is off loopback and the server has no token (:func:`check_bind`).
        """
        check_bind(host, self.token, self.allow_no_token)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerProtocol(self), host, port, backlog=4096)
        return self._server.sockets[0].getsockname()[1]

    async def close(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting, let requests in flight finish (up to ``grace`` seconds), then close every connection."""
        self.closing = True
        if self._server is None:
            return
        self._server.close()
        busy = []
        for conn in list(self._connections):
            if conn.task is None:
                conn.close()
            else:
                busy.append(conn.task)
        await drain(busy, grace, "request(s) in flight")
        for conn in list(self._connections):
            conn.close()
        await self._server.wait_closed()

    async def dispatch(self, request: Request) -> Response:
        """Answer one request (never raises, except on cancellation)."""
        if self._expected_auth is not None and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(), self._expected_auth):
            return _error(401, "missing or wrong token: send 'Authorization: Bearer <token>'")
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            if request.path in self._paths:
                return _error(405, f"method {request.method} not allowed on {request.path}")
            return _error(404, f"no route {request.path}")
        try:
            return await handler(request)
        except HTTPError as e:
            return _error(e.status, e.detail, e.headers)
        except Exception as e:
            logger.exception("%s %s failed", request.method, request.path)
            return _error(500, f"internal error in {request.path}: {e!r}")


class _ServerProtocol(asyncio.Protocol):
    """One client connection: parse requests as bytes arrive, answer them in order, one task at a time."""

    def __init__(self, server: HTTPServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: deque[tuple[Request | Response, bool]] = deque()  # (request or ready error, keep alive)
        self.task: asyncio.Task | None = None
        self.paused = False
        self.reading = False  # between the first byte of a request and its end
        self._timer: asyncio.TimerHandle | None = None  # idle (keep-alive) or read timeout, whichever applies
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0

    # transport callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server._connections.add(self)
        self._arm(KEEPALIVE_TIMEOUT_S, self.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        self.transport = None
        self._arm(None)
        if self.task is not None:  # the client is gone: nobody will read the answer, so stop working on it
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reply_and_close(_error(400, "protocol upgrades are not supported"))
        except httptools.HttpParserError as e:
            self._reply_and_close(_error(400, f"malformed HTTP request: {e}"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _arm(self, delay: float | None, action: Callable[[], None] | None = None) -> None:
        """Replace the connection's one timer by ``action`` after ``delay`` seconds (none if ``delay`` is None)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if delay is None else asyncio.get_running_loop().call_later(delay, action)

    def _read_timed_out(self) -> None:
        self._timer = None
        self.reading = False
        self._reply_and_close(_error(408, f"request not received in full within {REQUEST_READ_TIMEOUT_S:g}s"))

    def _reply_and_close(self, response: Response) -> None:
        """Answer ``response`` after the requests already queued, then close: the stream cannot be parsed on."""
        if self.transport is not None:
            self.transport.pause_reading()
        self.queue.append((response, False))
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._serve())

    # parser callbacks
    def on_message_begin(self) -> None:
        self.reading = True
        self._arm(REQUEST_READ_TIMEOUT_S, self._read_timed_out)
        self._url, self._headers, self._body, self._size = b"", {}, [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size <= self.server.max_body:  # beyond: read and drop the rest, then answer 413
            self._body.append(body)

    def on_message_complete(self) -> None:
        self.reading = False
        self._arm(None)
        keep_alive = self.parser.should_keep_alive()
        if self._size > self.server.max_body:
            limit_mb = self.server.max_body / 2**20
            item: Request | Response = _error(413, f"request body too large ({self._size} bytes > {limit_mb:g} MiB); "
                                                   "raise max_body_mb if such messages are expected")
            keep_alive = False
        else:
            path, _, query = self._url.decode("latin-1").partition("?")
            item = Request(self.parser.get_method().decode(), path, query, self._headers, b"".join(self._body))
        self.queue.append((item, keep_alive))
        if len(self.queue) >= _PIPELINE_DEPTH and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        while self.queue:
            item, keep_alive = self.queue.popleft()
            if self.paused and self.transport is not None:
                self.transport.resume_reading()
                self.paused = False
            response = item if isinstance(item, Response) else await self.server.dispatch(item)
            if self.transport is None:  # the client went away: its answer has nowhere to go
                break
            keep_alive = keep_alive and not self.server.closing
            self.transport.write(response.encode(keep_alive))
            if not keep_alive:
                self.transport.close()
                break
        self.task = None
        if self.transport is not None and not self.queue and not self.reading:
            self._arm(KEEPALIVE_TIMEOUT_S, self.close)


# ---- client --------------------------------------------------------------------------------------


class ClientError(Exception):
    """A request failed below HTTP (no connection, broken connection, malformed reply)."""


class ConnectError(ClientError):
    """No connection could be opened: the server cannot have seen the request (always safe to retry)."""


class ServerDisconnectedError(ClientError):
    """The connection closed (or the reply was malformed) before the full reply arrived."""


class ClientResponse:
    """A received reply: ``headers`` has lower-case names."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return orjson.loads(self.body)


@lru_cache(maxsize=4096)
def _split_url(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"unsupported URL {url!r}: expected http://host[:port]/path (no TLS in this client)")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port or 80, target


class _ClientProtocol(asyncio.Protocol):
    """One keep-alive connection; carries one request at a time."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.pool: list[_ClientProtocol] | None = None  # the idle list holding this connection, if any
        self.last_used = time.monotonic()
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    @property
    def usable(self) -> bool:
        return self.transport is not None and time.monotonic() - self.last_used < CLIENT_IDLE_S

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.pool is not None:  # closed while idle (e.g. the server's keep-alive timeout): forget it
            self.pool.remove(self)
            self.pool = None
        self._fail(ServerDisconnectedError(f"server closed the connection before replying ({exc!r})"))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(ServerDisconnectedError(f"malformed HTTP reply: {e}"))
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def on_message_begin(self) -> None:
        self._headers, self._body = {}, []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        response = ClientResponse(self.parser.get_status_code(), self._headers, b"".join(self._body))
        if self.waiter is None or self.waiter.done():  # a reply nobody asked for: the stream is out of step
            self.close()
            return
        if not self.parser.should_keep_alive():
            self.close()
        self.waiter.set_result(response)


class HTTPClient:
    """A pooled keep-alive HTTP/1.1 client for JSON APIs on plain ``http://`` URLs.

    Args:
        headers: Sent with every request (e.g. ``Authorization``).
        timeout: Default seconds for one request, connecting included.
        max_connections: Requests in flight at once (more wait their turn); 0: no limit.
    """

    def __init__(self, headers: dict[str, str] | None = None, timeout: float = 300.0, max_connections: int = 0) -> None:
        self._base_headers = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in (headers or {}).items())
        self.timeout = timeout
        self._gate = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._idle: dict[tuple[str, int], list[_ClientProtocol]] = {}
        self._busy: set[_ClientProtocol] = set()
        self.closed = False

    async def request(self, method: str, url: str, body: bytes | None = None, *,
                      headers: dict[str, str] | None = None, timeout: float | None = None) -> ClientResponse:
        """Send one request and return the full reply (any status); a body is JSON unless ``headers`` give its
        ``Content-Type``.

        Raises:
            ConnectError: No connection could be opened.
            ServerDisconnectedError: The connection broke before the full reply.
            TimeoutError: No full reply within ``timeout`` seconds.
        """
        if self.closed:
            raise RuntimeError("HTTPClient is closed")
        host, port, target = _split_url(url)
        head = [b"%s %s HTTP/1.1\r\nHost: %s:%d\r\n" % (method.encode(), target.encode(), host.encode(), port),
                self._base_headers]
        if headers:
            head.extend(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items())
        if body is not None:
            if not headers or not any(k.lower() == "content-type" for k in headers):
                head.append(b"Content-Type: application/json\r\n")  # unless the caller named another
            head.append(b"Content-Length: %d\r\n\r\n" % len(body))
            head.append(body)
        else:
            head.append(b"\r\n")
        payload = b"".join(head)
        if self._gate is None:
            return await self._send(host, port, payload, timeout or self.timeout, body is not None)
        async with self._gate:
            return await self._send(host, port, payload, timeout or self.timeout, body is not None)

    async def _send(self, host: str, port: int, payload: bytes, timeout: float,
                    body_sent: bool) -> ClientResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await self._acquire(host, port, timeout)
        waiter = conn.waiter = loop.create_future()
        timer = loop.call_at(deadline, _expire, waiter, timeout)
        self._busy.add(conn)
        try:
            conn.transport.write(payload)
            response = await waiter
        except BaseException:  # timeout, broken connection or cancellation: the connection's state is unknown
            conn.close()
            raise
        finally:
            timer.cancel()
            conn.waiter = None
            self._busy.discard(conn)
        if body_sent and response.status >= 400:
            # A server may refuse a request before it has read the body; the unread rest would be taken as the
            # next request on this connection, so it carries no other.
            conn.close()
        if conn.transport is not None and not self.closed:
            conn.last_used = time.monotonic()
            conn.pool = self._idle.setdefault((host, port), [])
            conn.pool.append(conn)
        return response

    async def _acquire(self, host: str, port: int, timeout: float) -> _ClientProtocol:
        idle = self._idle.get((host, port))
        while idle:
            conn = idle.pop()  # most recently used first: its peer is least likely to have timed it out
            conn.pool = None
            if conn.usable:
                return conn
            conn.close()
        try:
            _, conn = await asyncio.wait_for(asyncio.get_running_loop().create_connection(_ClientProtocol, host, port),
                                             timeout)
        except (OSError, TimeoutError) as e:
            raise ConnectError(f"cannot connect to {host}:{port}: {e!r}") from e
        if conn.transport is None:  # closed by the peer before it carried anything (a server going down)
            raise ConnectError(f"cannot connect to {host}:{port}: the connection closed as it opened")
        return conn

    async def close(self) -> None:
        """Close every connection (requests in flight fail with :class:`ServerDisconnectedError`)."""
        self.closed = True
        for conn in [*self._busy, *(c for conns in self._idle.values() for c in conns)]:
            conn.pool = None
            conn.close()
        self._idle.clear()


def _expire(waiter: asyncio.Future, timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"no reply within {timeout:g}s"))


# ---- running a server process --------------------------------------------------------------------


async def drain(tasks: Collection[asyncio.Task], grace: float, what: str) -> None:
    """Wait up to ``grace`` seconds for ``tasks``, then cancel (and await) the rest: shutdown never hangs."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=grace)
    if pending:
        logger.warning("%d %s still running after %.1fs at shutdown; cancelled", len(pending), what, grace)
        for task in pending:
            task.cancel()
        await asyncio.wait(pending)


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop_event)`` on uvloop when available, setting ``stop_event`` on SIGINT/SIGTERM."""

    async def wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        import uvloop
    except ImportError:
        asyncio.run(wrapper())
    else:
        uvloop.run(wrapper())
