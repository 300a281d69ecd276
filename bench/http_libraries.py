"""Maintained HTTP libraries in place of ``env_adapters/http.py``, for ``bench.controller --http``.

Each variant swaps only the transport: requests are still routed, authenticated and answered by our
:meth:`HTTPServer.dispatch` and the controller's and worker's handlers, so a difference in the figures is the HTTP
layer's. Variants:

- ``aiohttp``: aiohttp's low-level server (``aiohttp.web.Server``, its C ``llhttp`` parser, no router or
  middlewares) and ``aiohttp.ClientSession`` as the client (pooled keep-alive connections);
- ``uvicorn``: uvicorn with the httptools parser serving a raw ASGI app (no framework), aiohttp's client; its
  keep-alive timeout raised from 5 s to ours (75 s), else the client reuses connections as uvicorn closes them.

``python -m bench.http_libraries VARIANT ARGS...`` runs ``agentrl-env ARGS...`` with the variant installed (how
the benchmark starts its controller and worker). aiohttp (``.[test]``) and uvicorn (``.[train]``) are imported
only when a variant needs them.

Results and how to read them: ``docs/environments/index.md``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

from env_adapters import client as client_module
from env_adapters import controller as controller_module
from env_adapters import worker as worker_module
from env_adapters.http import (
    DEFAULT_MAX_BODY_MB,
    KEEPALIVE_TIMEOUT_S,
    SHUTDOWN_GRACE_S,
    ClientResponse,
    ConnectError,
    Handler,
    HTTPClient,
    HTTPServer,
    Request,
    Response,
    ServerDisconnectedError,
    check_bind,
)


def _too_large(limit: int) -> Response:
    return Response(413, b'{"detail": "request body too large (> %d bytes)"}' % limit)


class AiohttpServer:
    """:class:`HTTPServer`'s interface on aiohttp's low-level server."""

    def __init__(self, routes: dict[tuple[str, str], Handler], token: str | None = None,
                 max_body_mb: float = DEFAULT_MAX_BODY_MB, slack_bytes: int = 0, allow_no_token: bool = False) -> None:
        # Routing, auth, errors and the loopback rule stay ours.
        self.ours = HTTPServer(routes, token, max_body_mb, slack_bytes, allow_no_token)
        self._server: Any = None
        self._listener: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> int:
        from aiohttp import web

        check_bind(host, self.ours.token, self.ours.allow_no_token)
        self._response = web.Response
        self._server = web.Server(self._handle, access_log=None)
        self._listener = await asyncio.get_running_loop().create_server(self._server, host, port, backlog=4096)
        return self._listener.sockets[0].getsockname()[1]

    async def _handle(self, request: Any) -> Any:
        body = await request.content.read(self.ours.max_body + 1)
        if len(body) > self.ours.max_body:
            response = _too_large(self.ours.max_body)
        else:
            headers = {k.lower(): v for k, v in request.headers.items()}
            response = await self.ours.dispatch(Request(request.method, request.path, request.query_string, headers,
                                                        body))
        return self._response(status=response.status, body=response.body, headers=response.headers,
                            content_type=None if response.headers and "Content-Type" in response.headers
                            else "application/json")

    async def close(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        if self._listener is None:
            return
        self._listener.close()
        await self._server.shutdown(grace)
        await self._listener.wait_closed()


class UvicornServer:
    """:class:`HTTPServer`'s interface on uvicorn (httptools parser) serving a raw ASGI app."""

    def __init__(self, routes: dict[tuple[str, str], Handler], token: str | None = None,
                 max_body_mb: float = DEFAULT_MAX_BODY_MB, slack_bytes: int = 0, allow_no_token: bool = False) -> None:
        self.ours = HTTPServer(routes, token, max_body_mb, slack_bytes, allow_no_token)
        self._server: Any = None
        self._serving: asyncio.Task | None = None

    async def start(self, host: str, port: int) -> int:
        import uvicorn

        check_bind(host, self.ours.token, self.ours.allow_no_token)
        sock = socket.create_server((host, port), backlog=4096)
        config = uvicorn.Config(self._app, http="httptools", interface="asgi3", lifespan="off", proxy_headers=False,
                                access_log=False, log_level="warning", timeout_keep_alive=int(KEEPALIVE_TIMEOUT_S),
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # the process's own handlers stay in charge
        self._serving = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            await asyncio.sleep(0.01)
        return sock.getsockname()[1]

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.ours.max_body:
                chunks.append(chunk)
            more = message.get("more_body", False)
        if size > self.ours.max_body:
            response = _too_large(self.ours.max_body)
        else:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            response = await self.ours.dispatch(Request(scope["method"], scope["path"],
                                                        scope["query_string"].decode("latin-1"), headers,
                                                        b"".join(chunks)))
        extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (response.headers or {}).items()]
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(b"content-type", b"application/json"), *extra]})
        await send({"type": "http.response.body", "body": response.body})

    async def close(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        if self._serving is not None:
            self._server.should_exit = True
            await self._serving


class AiohttpClient:
    """:class:`HTTPClient`'s interface (and typed errors) on ``aiohttp.ClientSession``."""

    def __init__(self, headers: dict[str, str] | None = None, timeout: float = 300.0, max_connections: int = 0
                 ) -> None:
        self.headers, self.timeout, self.max_connections = headers or {}, timeout, max_connections
        import aiohttp

        self._aiohttp = aiohttp
        self._session: Any = None
        self.closed = False

    async def request(self, method: str, url: str, body: bytes | None = None, *,
                      headers: dict[str, str] | None = None, timeout: float | None = None) -> ClientResponse:
        aiohttp = self._aiohttp
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self.headers,
                                                  connector=aiohttp.TCPConnector(limit=self.max_connections))
        if body is not None:
            headers = {"Content-Type": "application/json", **(headers or {})}
        try:
            async with self._session.request(method, url, data=body, headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=timeout or self.timeout)) as r:
                data = await r.read()
                return ClientResponse(r.status, {k.lower(): v for k, v in r.headers.items()}, data)
        except aiohttp.ClientConnectorError as e:
            raise ConnectError(f"cannot connect: {e!r}") from e
        except aiohttp.ClientError as e:
            raise ServerDisconnectedError(repr(e)) from e

    async def close(self) -> None:
        self.closed = True
        if self._session is not None:
            await self._session.close()


VARIANTS = {"ours": (HTTPServer, HTTPClient), "aiohttp": (AiohttpServer, AiohttpClient),
            "uvicorn": (UvicornServer, AiohttpClient)}


def install(variant: str) -> None:
    """Make the controller, the worker and :class:`EnvClient` of this process use ``variant`` (``ours`` undoes)."""
    server, client = VARIANTS[variant]
    for module in (controller_module, worker_module):
        module.HTTPServer, module.HTTPClient = server, client
    client_module.HTTPClient = client


if __name__ == "__main__":
    from env_adapters.cli import main

    install(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
