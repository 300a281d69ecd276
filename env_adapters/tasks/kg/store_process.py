"""The ``kg`` task's embedded Oxigraph store in a process of its own, so that a query can be stopped.

Oxigraph cannot interrupt a query, and a policy can write one that runs for minutes (nine self-intersections, then
``get_relations``: over 280 s on the generated graph). So the store lives in child processes, each loaded with the
graph, and :class:`StoreProcess` kills the one whose query runs past its time bound (a fresh one takes its place).

The child runs this file as a script, ``python -P store_process.py REQUESTS REPLIES`` (two pipe descriptors; ``-P``:
this folder is not put on its path, so no module here shadows another; the parent's ``PYTHONPATH`` stays, where
pyoxigraph may be installed), and imports only the standard library and pyoxigraph: it receives the graph (N-Triples
bytes, or the path of an ``.nt`` file), answers ``("ready", triples)``, then answers each query with ``("ok",
values)`` (the first projected variable's values) or ``("error", message)``. It gets SIGKILL when the thread that
started it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

START_TIMEOUT_S = 120.0


class StoreProcessError(RuntimeError):
    """The store process failed to start, or died while answering."""


class QueryError(StoreProcessError):
    """The store refused the query (a syntax error); the process goes on."""


class QueryTimeout(Exception):
    """A query ran past its time bound; its process was killed."""


class StoreProcess:
    """One child process holding the graph in an in-memory Oxigraph store.

    Args:
        graph: N-Triples bytes, or the path of an N-Triples file.

    Raises:
        StoreProcessError: the child did not start or could not load the graph.
    """

    def __init__(self, graph: bytes | Path) -> None:
        from env_adapters.sandbox.servers import die_with_parent  # not at the top: the child runs this file alone

        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-P", __file__, str(request_read), str(reply_write)],
                pass_fds=(request_read, reply_write), preexec_fn=die_with_parent, stdin=subprocess.DEVNULL)
        finally:
            os.close(request_read)
            os.close(reply_write)
        self._requests = Connection(request_write, readable=False)
        self._replies = Connection(reply_read, writable=False)
        try:
            self._requests.send(str(graph) if isinstance(graph, Path) else graph)
            self.triples = self._answer(START_TIMEOUT_S, "ready")
        except BaseException:
            self.kill()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def query(self, query: str, timeout: float) -> list[str]:
        """The lexical values of the first projected variable, one per solution (unbound ones skipped).

        Raises:
            QueryTimeout: no answer within ``timeout`` seconds (kill the process: it is still running the query).
            QueryError: the store refused the query.
            StoreProcessError: the process died.
        """
        try:
            self._requests.send(query)
        except OSError as e:
            raise StoreProcessError(f"the store process {self.pid} is gone ({e})") from e
        return self._answer(timeout, "ok")

    def _answer(self, timeout: float, kind: str):  # noqa: ANN202 - the triple count or the values
        try:
            if not self._replies.poll(timeout):
                raise QueryTimeout(f"no answer within {timeout:g} s")
            got, value = self._replies.recv()
        except (EOFError, OSError) as e:
            raise StoreProcessError(f"the store process {self.pid} died (exit code {self._proc.poll()})") from e
        if got != kind:
            raise QueryError(value)
        return value

    def signal_kill(self) -> None:
        """Send the process SIGKILL; safe from any thread (a query waiting on it ends with StoreProcessError)."""
        if self._proc.poll() is None:
            self._proc.kill()

    def kill(self) -> None:
        """Stop the process at once and release its pipes; only from the thread that queries it. Idempotent."""
        self.signal_kill()
        self._proc.wait()
        self._requests.close()
        self._replies.close()


def _serve(requests: Connection, replies: Connection) -> None:
    import pyoxigraph

    graph = requests.recv()
    store = pyoxigraph.Store()
    try:
        if isinstance(graph, str):
            store.bulk_load(path=graph, format=pyoxigraph.RdfFormat.N_TRIPLES)
        else:
            store.bulk_load(graph, format=pyoxigraph.RdfFormat.N_TRIPLES)
    except (SyntaxError, OSError) as e:
        replies.send(("error", f"the embedded store could not load the graph: {e}"))
        return
    replies.send(("ready", len(store)))
    while True:
        try:
            query = requests.recv()
        except EOFError:  # the owner closed its end
            return
        try:
            values = [row[0].value for row in store.query(query) if row[0] is not None]
        except (SyntaxError, OSError) as e:
            replies.send(("error", f"embedded SPARQL store failed: {e} in query {query[:500]!r}"))
        else:
            replies.send(("ok", values))


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
