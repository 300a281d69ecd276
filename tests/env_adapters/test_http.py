"""The lean HTTP layer under the controller and workers: server errors, pipelining, limits, the pooled client,
and shutdown that never hangs."""

import asyncio

import pytest

from env_adapters import http
from env_adapters.http import (
    ConnectError,
    HTTPClient,
    HTTPError,
    HTTPServer,
    Request,
    ServerDisconnectedError,
    drain,
    dumps,
    json_response,
    read_json,
)


async def echo(request: Request):
    return json_response({"method": request.method, "path": request.path, "query": request.query,
                          "body": read_json(request) if request.body else None, "headers": request.headers},
                         headers={"session_id": "7"})


async def slow(request: Request):
    await asyncio.sleep(float(request.query.get("s", "30")))
    return json_response({"slept": True})


async def refuse(request: Request):
    raise HTTPError(409, "busy on purpose", headers={"Retry-After": "1"})


async def broken(request: Request):
    raise RuntimeError("bug on purpose")


ROUTES = {("POST", "/api/echo"): echo, ("GET", "/api/echo"): echo, ("GET", "/api/slow"): slow,
          ("POST", "/api/refuse"): refuse, ("GET", "/api/broken"): broken}


@pytest.fixture
async def server():
    """``(server, base_url, client)`` on a free port; everything closed after the test."""
    srv = HTTPServer(ROUTES, max_body_mb=0.01)
    port = await srv.start("127.0.0.1", 0)
    client = HTTPClient(timeout=5)
    yield srv, f"http://127.0.0.1:{port}", client
    await client.close()
    await srv.close(grace=0.1)


async def raw_exchange(url: str, payload: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(payload)
    data = await asyncio.wait_for(reader.read(), 5)  # until the server closes
    writer.close()
    return data


async def test_round_trip_headers_query_and_keep_alive(server):
    srv, url, client = server
    for i in range(3):
        r = await client.request("POST", f"{url}/api/echo?x={i}&y=a%20b", b'{"k": 1}', headers={"Session_Id": "3"})
        assert r.status == 200 and r.headers["session_id"] == "7"
        out = r.json()
        assert out["query"] == {"x": str(i), "y": "a b"} and out["body"] == {"k": 1}
        assert out["headers"]["session_id"] == "3"  # names arrive lower-case
    assert len(srv._connections) == 1  # one keep-alive connection carried all three


async def test_errors_are_json_detail(server):
    _, url, client = server
    cases = [("GET", "/api/nope", 404, "no route /api/nope"), ("DELETE", "/api/echo", 405, "not allowed"),
             ("POST", "/api/refuse", 409, "busy on purpose"), ("GET", "/api/broken", 500, "bug on purpose")]
    for method, path, status, text in cases:
        r = await client.request(method, url + path)
        assert r.status == status and text in r.json()["detail"]
    r = await client.request("POST", f"{url}/api/refuse", b"{}")
    assert r.headers["retry-after"] == "1"
    for body, text in [(b"[1]", "must be a JSON object, got list"), (b"{nope", "not valid JSON")]:
        r = await client.request("POST", f"{url}/api/echo", body)
        assert r.status == 400 and text in r.json()["detail"]


async def test_body_limit_malformed_request_and_pipelining(server):
    _, url, client = server
    r = await client.request("POST", f"{url}/api/echo", b'"' + b"x" * 20000 + b'"')
    assert r.status == 413 and "too large" in r.json()["detail"]
    reply = await raw_exchange(url, b"NOT HTTP AT ALL\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400") and b"malformed HTTP request" in reply
    # Two requests in one write (pipelined), then a close: both answered, in order.
    reply = await raw_exchange(url, b"GET /api/echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                                    b"GET /api/echo?n=2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert reply.count(b"HTTP/1.1 200 OK") == 2 and reply.index(b'"n":"1"') < reply.index(b'"n":"2"')
    # A chunked body is accepted like a sized one.
    reply = await raw_exchange(url, b"POST /api/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                    b"Connection: close\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n")
    assert b'"body":{"a":1}' in reply


async def test_token_required_when_set():
    srv = HTTPServer(ROUTES, token="s3cret")
    port = await srv.start("127.0.0.1", 0)
    client = HTTPClient()
    try:
        assert (await client.request("GET", f"http://127.0.0.1:{port}/api/echo")).status == 401
        authed = await client.request("GET", f"http://127.0.0.1:{port}/api/echo",
                                      headers={"Authorization": "Bearer s3cret"})
        assert authed.status == 200
    finally:
        await client.close()
        await srv.close()


async def test_client_failures_are_typed(server):
    srv, url, client = server
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    free_port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    with pytest.raises(ConnectError, match="cannot connect"):
        await client.request("GET", f"http://127.0.0.1:{free_port}/api/echo")
    with pytest.raises(TimeoutError):
        await client.request("GET", f"{url}/api/slow?s=30", timeout=0.2)
    assert (await client.request("GET", f"{url}/api/echo")).status == 200  # a fresh connection after the timeout

    async def hang_up(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    rude = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    try:
        with pytest.raises(ServerDisconnectedError):
            await client.request("GET", f"http://127.0.0.1:{rude.sockets[0].getsockname()[1]}/x")
    finally:
        rude.close()
        await rude.wait_closed()
    with pytest.raises(ValueError, match="unsupported URL"):
        await client.request("GET", "https://example.org/")


async def test_close_waits_for_requests_in_flight_only_up_to_grace(server):
    srv, url, client = server
    quick = asyncio.create_task(client.request("GET", f"{url}/api/slow?s=0.1"))
    stuck = asyncio.create_task(client.request("GET", f"{url}/api/slow?s=30"))
    await asyncio.sleep(0.05)
    await srv.close(grace=0.5)
    assert (await quick).json() == {"slept": True}  # finished within the grace period and answered
    assert not stuck.done()  # close did not wait for it: its 30 s are still running, its connection is being cut
    with pytest.raises(ServerDisconnectedError):
        await stuck


async def test_drain_cancels_what_outlives_grace():
    fast = asyncio.create_task(asyncio.sleep(0.01))
    stuck = asyncio.create_task(asyncio.sleep(30))
    await drain([fast, stuck], 0.2, "test task(s)")
    assert fast.done() and not fast.cancelled() and stuck.cancelled()  # the stuck one was cut at the grace


async def test_a_connection_the_server_closes_as_it_opens_is_a_connect_error(server, monkeypatch):
    # A controller killed mid-run: a new connection can be accepted and closed before the request is written. It
    # never carried the request, so it must fail as a connection that could not be opened (which callers retry).
    srv, url, client = server
    opened = http._ClientProtocol.connection_made

    def opened_then_closed(self, transport):
        opened(self, transport)
        transport.abort()
        self.connection_lost(None)  # delivered before the request is sent

    monkeypatch.setattr(http._ClientProtocol, "connection_made", opened_then_closed)
    with pytest.raises(ConnectError, match="closed as it opened"):
        await client.request("GET", f"{url}/api/echo")
    monkeypatch.undo()
    assert (await client.request("GET", f"{url}/api/echo")).status == 200


async def test_connection_closed_by_server_while_idle_is_not_reused():
    srv = HTTPServer(ROUTES)
    port = await srv.start("127.0.0.1", 0)
    client = HTTPClient(timeout=5)
    try:
        assert (await client.request("GET", f"http://127.0.0.1:{port}/api/echo")).status == 200
        await srv.close()  # closes the client's idle keep-alive connection
        srv = HTTPServer(ROUTES)
        await srv.start("127.0.0.1", port)  # the same address again, as a restarted worker would be
        await asyncio.sleep(0.05)
        assert (await client.request("GET", f"http://127.0.0.1:{port}/api/echo")).status == 200
    finally:
        await client.close()
        await srv.close()


async def scripted_server(answer) -> tuple[asyncio.Server, int, list[int]]:
    """A raw server that reads each request's head only (never its body) and writes ``answer(first_line)``; returns
    the server, its port and the list of connections' request counts."""
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(0)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                connections[-1] += 1
                writer.write(answer(head.split(b"\r\n")[0].decode()))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1], connections


def reply(status: int, text: str) -> bytes:
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(text), text.encode())


async def test_a_reply_nobody_asked_for_ends_its_connection():
    # Each request is answered, then answered again: the second reply must never pass for the next request's.
    srv, port, connections = await scripted_server(lambda line: reply(200, line) + reply(200, "stale"))
    client = HTTPClient(timeout=5)
    try:
        for path in ("/one", "/two"):
            answer = await client.request("GET", f"http://127.0.0.1:{port}{path}")
            assert answer.body == f"GET {path} HTTP/1.1".encode()
        assert connections == [1, 1]
    finally:
        await client.close()
        srv.close()


async def test_an_error_reply_to_a_request_with_a_body_ends_its_connection():
    # The server refuses the POST from its head and leaves the body unread: on the same connection the body's bytes
    # would prefix the next request.
    srv, port, connections = await scripted_server(lambda line: reply(400 if line.startswith("POST") else 200, line))
    client = HTTPClient(timeout=5)
    try:
        assert (await client.request("POST", f"http://127.0.0.1:{port}/q", b"[1]")).status == 400
        assert (await client.request("GET", f"http://127.0.0.1:{port}/two")).body == b"GET /two HTTP/1.1"
        assert (await client.request("GET", f"http://127.0.0.1:{port}/three")).status == 200
        assert connections == [1, 2]  # successes keep their connection
    finally:
        await client.close()
        srv.close()


@pytest.mark.parametrize("payload", [b"POST /api/echo HTTP/1.1\r\nHost: x\r\nContent-Le",
                                     b"POST /api/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"a\""])
async def test_incomplete_request_times_out(server, monkeypatch, payload):
    """A client that sends part of a request and then nothing is answered 408 and disconnected."""
    monkeypatch.setattr(http, "REQUEST_READ_TIMEOUT_S", 0.2)
    srv, url, client = server
    reply = await raw_exchange(url, payload)
    assert reply.startswith(b"HTTP/1.1 408") and b"not received in full within 0.2s" in reply
    assert not srv._connections
    # A request that arrives whole on a keep-alive connection is not cut off, however long its handler takes.
    assert (await client.request("GET", f"{url}/api/slow?s=0.5")).json() == {"slept": True}


async def test_departed_client_cancels_its_handler(server):
    srv, url, _ = server
    host, port = url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /api/slow?s=30 HTTP/1.1\r\nHost: x\r\n\r\n")
    while not any(conn.task for conn in srv._connections):
        await asyncio.sleep(0.01)
    handler = next(conn.task for conn in srv._connections if conn.task)
    writer.close()
    await asyncio.wait_for(asyncio.wait([handler]), 5)
    assert handler.cancelled()


def test_json_with_lone_surrogates_travels_for_the_handler_to_judge():
    body = dumps({"text": "a\ud800"})  # orjson alone refuses to encode it
    assert body == b'{"text":"a\\ud800"}'
    assert read_json(Request("POST", "/", "", {}, body)) == {"text": "a\ud800"}
    for bad in (b'{"x": NaN}', b'{"x": "\\ud800', b"{nope"):
        with pytest.raises(HTTPError, match="not valid JSON"):
            read_json(Request("POST", "/", "", {}, bad))


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.5", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.1.2.3", False), ("no-such-host.invalid", False),
])
def test_loopback_is_told_from_every_other_address(host, loopback):
    assert http.is_loopback(host) is loopback


async def test_no_server_listens_off_loopback_without_a_token(caplog):
    srv = HTTPServer(ROUTES)
    with pytest.raises(http.InsecureBindError, match=r"(?s)'0\.0\.0\.0' without a token.*--token.*--allow-no-token"):
        await srv.start("0.0.0.0", 0)
    assert srv._server is None  # refused before listening
    http.check_bind("0.0.0.0", "s3cret")  # with a token: allowed
    http.check_bind("127.0.0.1", None)  # loopback: allowed
    with caplog.at_level("WARNING", logger="env_adapters.http"):
        http.check_bind("0.0.0.0", None, allow_no_token=True)  # the opt-out, loudly
    assert "WITHOUT A TOKEN" in caplog.text


def test_a_token_file_is_made_once_private_and_then_read(tmp_path):
    path = tmp_path / "keys" / "env.token"
    token = http.ensure_token_file(path)
    assert len(token) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert http.ensure_token_file(path) == token == http.read_token_file(path)  # kept, never replaced
    with pytest.raises(ValueError, match="cannot read the token file"):
        http.read_token_file(tmp_path / "missing")
