"""Helpers of the kg tests: playing episodes, and a SPARQL HTTP endpoint served from a pyoxigraph store."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from env_adapters.protocol import Message
from env_adapters.task import StepResult
from env_adapters.tasks.kg.expert import kg_expert
from env_adapters.tasks.kg.task import KGTask


async def play(task: KGTask, index: int, policy: Callable[..., Message] = kg_expert) -> tuple[StepResult, list]:
    """Run one episode of ``policy`` in process; returns the last step and the whole conversation."""
    session = await task.start_session(index)
    result = await session.reset()
    messages = list(result.messages)
    try:
        while not result.status.finished:
            message = policy(task, index, messages)
            messages.append(message)
            result = await session.step(message)
            messages.extend(result.messages)
    finally:
        await session.close()
    return result, messages


@contextlib.contextmanager
def sparql_endpoint(ntriples: str, methods: list[str] | None = None) -> Iterator[str]:
    """A SPARQL 1.1 protocol endpoint (GET ``?query=`` or a form POST, JSON results) over ``ntriples``; yields its
    URL. ``methods`` gets the method of each query."""
    import pyoxigraph

    store = pyoxigraph.Store()
    store.bulk_load(ntriples, format=pyoxigraph.RdfFormat.N_TRIPLES)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(parse_qs(urlsplit(self.path).query)["query"][0])

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            form = self.rfile.read(int(self.headers["Content-Length"])).decode()
            assert self.headers["Content-Type"] == "application/x-www-form-urlencoded"
            self._answer(parse_qs(form)["query"][0])

        def _answer(self, query: str) -> None:
            if methods is not None:
                methods.append(self.command)
            try:
                body, status = store.query(query).serialize(format=pyoxigraph.QueryResultsFormat.JSON), 200
            except SyntaxError as e:
                body, status = str(e).encode(), 400
            self.send_response(status)
            self.send_header("Content-Type", "application/sparql-results+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/sparql"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
