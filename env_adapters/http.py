"""Small HTTP helpers shared by the controller and the worker (aiohttp server side).

Errors are answered as ``{"detail": "..."}`` like the upstream FastAPI worker, so that one client code path
reads both. JSON goes through orjson: on the interact hot path serialisation is a visible share of the cost.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
from typing import Any

import orjson
from aiohttp import web

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_MB = 4.0


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, headers=headers, content_type="application/json")


class HTTPError(Exception):
    """Raised by a handler to answer ``status`` with ``{"detail": detail}``."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong (413 when too large)."""
    body = await request.read()  # aiohttp raises 413 past client_max_size
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise HTTPError(400, f"request body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise HTTPError(400, f"request body must be a JSON object, got {type(data).__name__}")
    return data


def session_id_header(request: web.Request) -> int:
    raw = request.headers.get("session_id")
    if raw is None:
        raise HTTPError(400, "missing 'session_id' header")
    try:
        return int(raw)
    except ValueError as e:
        raise HTTPError(400, f"'session_id' header must be an integer, got {raw!r}") from e


def body_session_id(data: dict[str, Any]) -> int:
    sid = data.get("session_id")
    if isinstance(sid, bool) or not isinstance(sid, int):
        raise HTTPError(400, f"body must carry an integer 'session_id', got {sid!r}")
    return sid


@web.middleware
async def _json_errors(request: web.Request, handler):
    """Answer our errors and aiohttp's own (413, unknown route, 405) with a ``{"detail"}`` JSON body."""
    try:
        return await handler(request)
    except HTTPError as e:
        return json_response({"detail": e.detail}, e.status, e.headers)
    except web.HTTPException as e:
        if e.status_code < 400:
            raise
        detail = e.text or e.reason
        if e.status_code == 413:
            detail = f"request body too large ({detail}); raise max_body_mb if such messages are expected"
        return json_response({"detail": detail}, e.status_code)


def make_app(token: str | None, max_body_mb: float = DEFAULT_MAX_BODY_MB) -> web.Application:
    """An application with JSON errors, an optional shared-token check and a request size limit."""
    middlewares = [_json_errors]
    if token:
        expected = f"Bearer {token}".encode()

        @web.middleware
        async def auth(request: web.Request, handler):
            if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
                return json_response({"detail": "missing or wrong token: send 'Authorization: Bearer <token>'"}, 401)
            return await handler(request)

        middlewares.append(auth)
    return web.Application(middlewares=middlewares, client_max_size=int(max_body_mb * 2**20))


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host:port`` (0: any free port) and return the runner and the bound port."""
    # No access log: one log line per interact would cost more than the rest of the request.
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    return runner, runner.addresses[0][1]


def run_until_signal(main) -> None:
    """Run ``main(stop_event)`` on uvloop when available, setting ``stop_event`` on SIGINT/SIGTERM."""

    async def wrapper():
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
