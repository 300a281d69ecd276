"""SPARQL backends of the ``kg`` task: one interface, three ways to reach a graph.

- :class:`EmbeddedBackend`: `Oxigraph <https://github.com/oxigraph/oxigraph>`_ stores (pyoxigraph) loaded from
  N-Triples in child processes of the worker, so that a query can be stopped at its time bound; no server; the
  default;
- :class:`EndpointBackend`: any SPARQL 1.1 HTTP endpoint given by URL (a user's full Freebase in Virtuoso, as
  upstream runs it);
- :class:`VirtuosoServer` + :class:`EndpointBackend`: Virtuoso Open Source (Debian package
  ``virtuoso-opensource``) started by the task on loopback with its own folder, bulk-loaded from N-Triples and
  stopped with the worker.

Each backend answers :meth:`SparqlBackend.select` with the values of a one-column SELECT, written as upstream's
executor writes them: Freebase IRIs without their namespace, literals by their lexical form. The graph never
changes while the task runs, so answers are remembered (an LRU of ``cache_size`` queries shared by all sessions) and
identical queries in flight at once are sent once: the rollouts of one question (``rollout.n`` of them) ask the same
first queries.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import shutil
import subprocess
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from urllib.parse import urlencode

from env_adapters.http import ClientError, HTTPClient
from env_adapters.sandbox.servers import OwnedServer, die_with_parent, free_port, stop_at_exit
from env_adapters.task import run_blocking
from env_adapters.tasks.kg.sexpr import FB
from env_adapters.tasks.kg.store_process import QueryError, QueryTimeout, StoreProcess, StoreProcessError

logger = logging.getLogger(__name__)

SPARQL_JSON = "application/sparql-results+json"


class BackendError(RuntimeError):
    """The SPARQL store failed (not the agent's fault): the session ends with ``task error``."""


def freebase_value(value: str) -> str:
    """A result value as upstream's executor returns it (namespace and the ``-08:00`` zone dropped)."""
    return value.replace(FB, "").replace("-08:00", "")


MAX_CACHED_QUERY_CHARS = 16 * 1024
"""Longer queries are answered but not remembered: the task's own queries are far shorter, and a policy's calls on
megabyte-long entity ids would otherwise each keep their query for good (42 such calls: +316 MiB)."""
MAX_CACHE_BYTES = 128 * 1024 * 1024
"""What the remembered answers may hold in all, estimated as :func:`entry_bytes` counts them (least recently used
dropped first; an answer larger than this is not remembered): a bound for any sequence of queries, where a count of
entries alone bounds nothing when one answer can list a million values."""
_STR_OVERHEAD = 56  # bytes of a CPython str object (and its tuple slot) besides its characters, about


def entry_bytes(query: str, answer: tuple[str, ...]) -> int:
    return len(query) + _STR_OVERHEAD + sum(len(value) + _STR_OVERHEAD for value in answer)


class SparqlBackend(ABC):
    """Runs read-only SELECT queries, remembering the answers of the last ``cache_size`` distinct ones.

    Args:
        cache_size: Queries whose answers are kept (least recently used dropped first); 0 keeps none. Queries
            longer than :data:`MAX_CACHED_QUERY_CHARS` are never kept, and all kept answers together hold at most
            ``cache_bytes``.
        cache_bytes: See :data:`MAX_CACHE_BYTES`.
    """

    def __init__(self, cache_size: int = 0, cache_bytes: int = MAX_CACHE_BYTES) -> None:
        self.cache_size, self.cache_bytes = cache_size, cache_bytes
        self.cached_bytes = 0
        self._cache: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._running: dict[str, asyncio.Task[list[str]]] = {}
        self.hits = self.misses = 0

    async def select(self, query: str) -> list[str]:
        """The values of the query's single projected variable, one per solution (unbound ones skipped).

        Raises:
            BackendError: the store could not answer.
        """
        if not self.cache_size or len(query) > MAX_CACHED_QUERY_CHARS:
            return await self._select(query)
        cached = self._cache.get(query)
        if cached is not None:
            self._cache.move_to_end(query)
            self.hits += 1
            return list(cached)
        running = self._running.get(query)
        if running is None:
            self.misses += 1
            running = self._running[query] = asyncio.ensure_future(self._select(query))
            running.add_done_callback(lambda done: self._store(query, done))
        else:
            self.hits += 1
        # Shielded: a caller cancelled (its session ended) does not cancel the query for the others waiting on it.
        return list(await asyncio.shield(running))

    def _store(self, query: str, done: asyncio.Task[list[str]]) -> None:
        del self._running[query]
        if done.cancelled() or done.exception() is not None:  # failures are not remembered: the next call retries
            return
        answer = tuple(done.result())
        size = entry_bytes(query, answer)
        if size > self.cache_bytes:
            return
        self._cache[query], self.cached_bytes = answer, self.cached_bytes + size
        while len(self._cache) > self.cache_size or self.cached_bytes > self.cache_bytes:
            old_query, old_answer = self._cache.popitem(last=False)
            self.cached_bytes -= entry_bytes(old_query, old_answer)

    @abstractmethod
    async def _select(self, query: str) -> list[str]:
        """Run the query on the store (see :meth:`select`)."""

    async def alive(self) -> bool:
        """Whether the store answers now (the task's health check); a store in this process always does."""
        return True

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


TOO_COSTLY_CODES = ("SP031", "S1T00")
"""Virtuoso's errors for a query too large to compile (SP031: the SQL it generates passes 10,000 lines) or run past
its time limit (S1T00): the agent's program, answered as the family's tool error, as the embedded store's bound is."""

HEALTH_TIMEOUT_S = 3.0
"""Longest an endpoint may take to answer the health check's ``ASK {}`` (a store that answers takes milliseconds)."""

QUERY_TIMEOUT_S = 10.0
"""Time bound of one embedded-store query. The task's own queries take milliseconds on the generated graphs; a
policy's program can make one that runs for minutes (nine self-intersections, then ``get_relations``)."""


class QueryTooCostly(Exception):
    """The store stopped a query at its time bound, or refused it as too large: the agent's program is too costly to
    run (shown to the agent, not a store failure)."""


def check_store_options(processes: int, query_timeout: float) -> None:
    """Raises ValueError naming the task options ``query_processes``/``query_timeout`` if either is out of range."""
    if processes < 1 or query_timeout <= 0:
        raise ValueError(f"kg: query_processes must be >= 1 and query_timeout > 0, got {processes} and "
                         f"{query_timeout}")


class EmbeddedBackend(SparqlBackend):
    """Oxigraph stores holding the graph, in ``processes`` child processes (:mod:`.store_process`) that answer the
    sessions' queries, one query at a time each.

    Queries never run in the worker: Oxigraph cannot interrupt one, so a query past ``query_timeout`` has its process
    killed and replaced, and it raises :class:`QueryTooCostly`. Meanwhile the other processes answer the other
    sessions, so a session waits on another's costly query only when every process is busy with one, and then at most
    ``query_timeout`` seconds.

    Args:
        ntriples: N-Triples text, or the path of an ``.nt`` file.
        cache_size: See :class:`SparqlBackend`.
        processes: Store processes, each holding its own copy of the graph.
        query_timeout: Seconds one query may run.
    """

    def __init__(self, ntriples: str | bytes | Path, cache_size: int = 0, processes: int = 2,
                 query_timeout: float = QUERY_TIMEOUT_S) -> None:
        check_store_options(processes, query_timeout)
        super().__init__(cache_size)
        self.graph = ntriples.encode() if isinstance(ntriples, str) else ntriples
        self.query_timeout = query_timeout
        self._idle: queue.SimpleQueue[StoreProcess] = queue.SimpleQueue()
        self._live: set[StoreProcess] = set()
        self._lock = threading.Lock()
        self._closed = False
        try:
            for _ in range(processes):
                self._idle.put(self._start())
        except BaseException:
            self._kill_all()
            raise
        self.triples = next(iter(self._live)).triples

    def _start(self) -> StoreProcess:
        try:
            process = StoreProcess(self.graph)
        except StoreProcessError as e:
            raise BackendError(str(e)) from e
        with self._lock:
            self._live.add(process)
        return process

    def _retire(self, process: StoreProcess) -> None:
        process.kill()
        with self._lock:
            self._live.discard(process)

    async def _select(self, query: str) -> list[str]:
        # Waited for in the worker's threads, so the event loop goes on serving the other sessions and the heartbeats.
        return await run_blocking(self._query, query)

    def _query(self, query: str) -> list[str]:
        if self._closed:
            raise BackendError("the embedded store is closed")
        while True:  # waits while every process answers a query
            try:
                process = self._idle.get(timeout=1.0)
                break
            except queue.Empty:
                if self._closed:
                    raise BackendError("the embedded store is closed") from None
        try:
            return [freebase_value(value) for value in process.query(query, self.query_timeout)]
        except QueryError as e:
            raise BackendError(str(e)) from e
        except (QueryTimeout, StoreProcessError) as e:
            # Still running the query, or dead: a fresh process takes its place.
            self._retire(process)
            if not self._closed:
                process = self._start()
            if isinstance(e, QueryTimeout):
                raise QueryTooCostly(f"the query ran past its bound of {self.query_timeout:g} s and was "
                                     "stopped") from e
            raise BackendError(str(e)) from e
        finally:
            if self._closed:
                self._retire(process)
            else:
                self._idle.put(process)

    def _kill_all(self) -> None:
        while True:  # the idle processes, at once
            try:
                self._retire(self._idle.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            busy = list(self._live)
        for process in busy:  # the thread waiting on each retires it when the process is gone
            process.signal_kill()

    async def close(self) -> None:
        """Kill the store processes (a query still running in one ends with :class:`BackendError`)."""
        self._closed = True
        self._kill_all()

    def pids(self) -> list[int]:
        """The store processes' ids."""
        with self._lock:
            return sorted(p.pid for p in self._live)

    def __len__(self) -> int:
        return self.triples


MAX_GET_QUERY_CHARS = 2000
"""Encoded queries longer than this go by POST (seven nested intersections made a GET that Virtuoso refused)."""


class EndpointBackend(SparqlBackend):
    """A SPARQL 1.1 protocol endpoint over plain HTTP (queries sent as GET, longer ones as a form POST, which the
    protocol allows: a GET's URL is limited, Virtuoso's to a few KB; results read as SPARQL JSON).

    Args:
        url: The endpoint, e.g. ``http://127.0.0.1:8890/sparql``.
        timeout: Seconds per query.
        max_connections: Queries in flight at once.
        cache_size: See :class:`SparqlBackend`.
    """

    def __init__(self, url: str, timeout: float = 60.0, max_connections: int = 32, cache_size: int = 0) -> None:
        super().__init__(cache_size)
        if not url.startswith("http://"):
            raise ValueError(f"kg: sparql_url must be an http:// SPARQL endpoint, got {url!r}")
        self.url = url
        self.http = HTTPClient(headers={"Accept": SPARQL_JSON}, timeout=timeout, max_connections=max_connections)

    async def _select(self, query: str) -> list[str]:
        form = urlencode({"query": query})
        try:
            if len(form) <= MAX_GET_QUERY_CHARS:
                reply = await self.http.request("GET", f"{self.url}?{form}")
            else:
                reply = await self.http.request("POST", self.url, form.encode(),
                                                headers={"Content-Type": "application/x-www-form-urlencoded"})
        except (ClientError, OSError, TimeoutError) as e:
            raise BackendError(f"SPARQL endpoint {self.url} unreachable: {e}") from e
        if reply.status != 200:
            detail = reply.body[:500].decode(errors="replace")
            if any(code in detail for code in TOO_COSTLY_CODES):
                raise QueryTooCostly(f"the store refused the query as too costly ({detail.strip()[:200]})")
            raise BackendError(f"SPARQL endpoint {self.url} answered {reply.status}: {detail}")
        data = reply.json()
        (name,) = data["head"]["vars"]
        return [freebase_value(row[name]["value"]) for row in data["results"]["bindings"] if name in row]

    async def alive(self) -> bool:
        """An ``ASK {}`` answered within :data:`HEALTH_TIMEOUT_S` with SPARQL JSON (a stopped server accepts the
        connection and never answers: without the check its worker would keep getting sessions). The check opens its
        own connection, so that it never queues behind the queries in flight (``max_connections``)."""
        http = HTTPClient(headers={"Accept": SPARQL_JSON}, timeout=HEALTH_TIMEOUT_S)
        try:
            reply = await http.request("GET", f"{self.url}?{urlencode({'query': 'ASK {}'})}")
            return reply.status == 200 and "head" in reply.json()  # Virtuoso answers ASK as a one-row SELECT
        except (ClientError, OSError, TimeoutError, ValueError, TypeError):
            return False
        finally:
            await http.close()

    async def close(self) -> None:
        await self.http.close()


# ---- a private Virtuoso server -------------------------------------------------------------------------------

VIRTUOSO_PREFIX = "agentrl-virtuoso-"
# Tuned for many small queries, each run once: every query zeroes buffers of VectorSize rows per operator (Virtuoso's
# default of 10,000 made memset a fifth of the server's time per tool call; AdjustVectorSize grows them again for a
# query that reads many rows), and the SQL optimiser stops searching for plans once it has spent the best plan's
# estimated run time (StopCompilerWhenXOverRunTime; compiling is most of a cold query's cost).
_INI = """\
[Database]
DatabaseFile = {d}/virtuoso.db
ErrorLogFile = {d}/virtuoso.log
LockFile = {d}/virtuoso.lck
TransactionFile = {d}/virtuoso.trx
xa_persistent_file = {d}/virtuoso.pxa
[TempDatabase]
DatabaseFile = {d}/virtuoso-temp.db
TransactionFile = {d}/virtuoso-temp.trx
[Parameters]
ServerPort = 127.0.0.1:{sql_port}
DisableUnixSocket = 1
DirsAllowed = {dirs}
NumberOfBuffers = {buffers}
MaxDirtyBuffers = {dirty}
CheckpointInterval = 0
ThreadsPerQuery = 1
VectorSize = 64
AdjustVectorSize = 1
StopCompilerWhenXOverRunTime = 1
[HTTPServer]
ServerPort = 127.0.0.1:{http_port}
ServerRoot = {d}
ServerThreads = {threads}
MaxKeepAlives = {threads}
KeepAliveTimeout = 60
[SPARQL]
ResultSetMaxRows = 1000000
MaxQueryExecutionTime = 120
MaxQueryCostEstimationTime = 0
"""


class VirtuosoError(RuntimeError):
    """Virtuoso could not be started or loaded."""


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise VirtuosoError(f"{name!r} not found; install the Debian package 'virtuoso-opensource' (apt-get install "
                            "-y virtuoso-opensource), use backend: embedded, or give an endpoint with sparql_url")
    return path


class VirtuosoServer(OwnedServer):
    """Virtuoso Open Source on ``127.0.0.1`` (free SQL and HTTP ports) in a temporary folder of its own.

    The server gets the parent-death signal (it dies with the thread that started it: start it from a long-lived
    one), :meth:`stop` runs at exit and on SIGTERM, and a folder left by a killed owner is deleted by the next start
    (see :mod:`env_adapters.sandbox.servers`).

    Args:
        base_dir: Parent of the temporary folder; the system temp dir by default.
        startup_timeout: Seconds to wait for the HTTP endpoint.
        memory_mb: Page buffers, in MB (Virtuoso pages are 8 KiB).
        threads: HTTP server threads (concurrent SPARQL queries).
    """

    prefix, pid_file, log_file, error = VIRTUOSO_PREFIX, "server.pid", "virtuoso.log", VirtuosoError

    def __init__(self, base_dir: str | Path | None = None, startup_timeout: float = 120.0, memory_mb: int = 256,
                 threads: int = 16) -> None:
        super().__init__(base_dir, startup_timeout)
        self.memory_mb, self.threads = memory_mb, threads
        self.sql_port: int | None = None
        self.http_port: int | None = None

    @property
    def url(self) -> str:
        """The SPARQL endpoint of the running server."""
        if self.http_port is None:
            raise VirtuosoError("Virtuoso is not running; call start() first")
        return f"http://127.0.0.1:{self.http_port}/sparql"

    def start(self, load_dirs: tuple[Path, ...] = ()) -> VirtuosoServer:
        """Create the folder and start the server; returns once the SPARQL endpoint answers.

        Args:
            load_dirs: Extra folders the server may read N-Triples from (its own folder always).

        Raises:
            VirtuosoError: the binary is missing or the server did not come up (with the end of its log).
        """
        if self._proc is not None:
            return self
        binary = _binary("virtuoso-t")
        self._new_folder()
        buffers = max(2000, self.memory_mb * 1024 // 8)
        dirs = ", ".join(str(d) for d in (self.folder, *load_dirs))

        def launch() -> None:
            self.sql_port, self.http_port = free_port(), free_port()
            for lock in self.folder.glob("*.lck"):  # a launch that lost its port may leave its lock
                lock.unlink()
            (self.folder / "virtuoso.ini").write_text(_INI.format(
                d=self.folder, sql_port=self.sql_port, http_port=self.http_port, dirs=dirs, buffers=buffers,
                dirty=buffers * 3 // 4, threads=self.threads))
            self._proc = subprocess.Popen(
                [binary, "+foreground", "+configfile", str(self.folder / "virtuoso.ini")], cwd=self.folder,
                preexec_fn=die_with_parent, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            (self.folder / self.pid_file).write_text(str(self._proc.pid))
            stop_at_exit(self)
            self._wait_ready()

        try:
            self._launch_on_free_ports(launch, lambda: [self.sql_port, self.http_port])
        except BaseException:
            self.stop()
            raise
        logger.info("Virtuoso pid %d: SPARQL at %s (%s)", self._proc.pid, self.url, self.folder)
        return self

    def _wait_ready(self) -> None:
        import urllib.request

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"{self.url}?query=ASK%7B%7D", timeout=2):
                    return True
            except OSError:
                return False

        self._wait_until(answers, "answer SPARQL queries")

    def sql(self, statements: str, timeout: float = 3600.0) -> str:
        """Run SQL through ``isql-vt`` as ``dba`` (reachable only from this machine); returns its output.

        Raises:
            VirtuosoError: isql failed or reported an error.
        """
        run = subprocess.run([_binary("isql-vt"), f"127.0.0.1:{self.sql_port}", "dba", "dba", f"exec={statements}"],
                             capture_output=True, text=True, timeout=timeout)
        if run.returncode != 0 or "*** Error" in run.stdout + run.stderr:
            raise VirtuosoError(f"isql failed ({run.returncode}): {(run.stdout + run.stderr)[-2000:]}")
        return run.stdout

    def load(self, ntriples: Path, graph: str = "http://rdf.freebase.com") -> None:
        """Bulk-load an N-Triples file (in the server's folder or a ``load_dirs`` folder) into ``graph``."""
        path = Path(ntriples).resolve()
        self.sql(f"ld_dir('{path.parent}', '{path.name}', '{graph}'); rdf_loader_run(); checkpoint;")
        failed = self.sql("SELECT ll_file, ll_error FROM DB.DBA.LOAD_LIST WHERE ll_error IS NOT NULL;")
        if str(path) in failed:
            raise VirtuosoError(f"Virtuoso could not load {path}: {failed[-2000:]}")

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after ``timeout`` s) and delete its folder. Idempotent."""
        super().stop(timeout)
        self.sql_port = self.http_port = None
