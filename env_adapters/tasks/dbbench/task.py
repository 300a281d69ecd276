"""``db``: AgentBench's DBBench. The agent answers a question about, or modifies, a table it reaches only by SQL.

Each session gets its own fresh database holding the item's tables (every column TEXT, as upstream). Tools:
``execute_sql(query)`` runs one statement (results printed like a MySQL client library prints rows, cut at
``max_output_chars``) and ``commit_final_answer(answers)`` ends the episode with reward 1 or 0:

- SELECT-like items: the answers are compared with the item's label (:mod:`.scoring`);
- INSERT/UPDATE/DELETE items: the server hashes the final tables and the hash is compared with ``answer_md5``.

The episode also ends after ``max_rounds`` assistant messages (``task limit reached``, reward 0) and, as in every
task of this project, on a message without a valid tool call (``agent invalid action``). The session's database
is deleted when the session closes, whatever ended it.

Backends (option ``backend``): ``sqlite`` (default; embedded, no server; SQLite's SQL dialect; serves only the
SELECT-like items, because the table hash needs MySQL semantics) and ``mysql`` (a MySQL-compatible server: MariaDB
started by the task on loopback, or an existing server given by ``mysql_url``; serves every item).

A server that stops answering is never the agent's fault: sessions it cuts off end with ``task error``, and a
MariaDB server started by the task is restarted (same port and data) as soon as it dies; sessions that start
meanwhile wait for it. :meth:`DBBenchTask.healthy` says whether the server answers, so that a worker whose server
is down and cannot be restarted (an external ``mysql_url``) gets no new sessions until it answers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from env_adapters.protocol import Index, Message, SampleStatus
from env_adapters.task import (
    StepResult,
    Task,
    TaskError,
    ToolCall,
    ToolSession,
    assistant_tool_call,
    function_tool,
    register_task,
    tool_reply,
)
from env_adapters.tasks.dbbench.backends import (
    Backend,
    ConnectionLost,
    Database,
    MySQLBackend,
    ServerUnavailable,
    SQLError,
    SQLiteBackend,
    StatementTimeout,
)
from env_adapters.tasks.dbbench.items import (
    SYSTEM_PROMPT,
    Table,
    is_hash_scored,
    load_items,
    mysql_loadable,
    tables_of,
    user_prompt,
    validate_item,
)
from env_adapters.tasks.dbbench.scoring import answers_match, expected_hash

EXIT_SEEN_POLLS = 100
"""Checks, 50 ms apart, for the exit of a server that refuses connections before it counts as alive."""

logger = logging.getLogger(__name__)

TOOLS = [
    function_tool(
        "execute_sql",
        "Execute one SQL statement on the database and return its result",
        {"query": {"type": "string", "description": "a single SQL statement, on one line"}},
    ),
    function_tool(
        "commit_final_answer",
        "Commit the final answer and end the task; after modifying the database, commit anything",
        {"answers": {"type": "array", "items": {"type": "string"}, "description": "the answer value(s)"}},
    ),
]


def format_rows(rows: list[tuple[Any, ...]]) -> str:
    """Rows printed as upstream shows them to the agent: a Python list of tuples."""
    return str(rows)


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "[TRUNCATED]"


class DBBenchSession(ToolSession):
    """One DBBench episode on its own database."""

    tools = TOOLS
    no_call_hint = "the message calls no tool; call execute_sql or commit_final_answer"

    def __init__(self, task: DBBenchTask, item: dict[str, Any]) -> None:
        self.task = task
        self.item = item
        self.tables = tables_of(item)
        self.db: Database | None = None
        self.server_starts = 0
        self.max_rounds = task.max_rounds
        self.metrics: dict[str, Any] = {"sql_statements": 0, "sql_errors": 0, "sql_timeouts": 0}

    async def reset(self) -> StepResult:
        self.db = await self.task.open_database(self.tables)
        self.server_starts = self.task.server_starts
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_prompt(self.item)}]
        return StepResult(messages=messages, tools=TOOLS)

    def step_metrics(self) -> dict[str, Any]:
        self.metrics["rounds"] = self.rounds
        return self.metrics

    async def tool_execute_sql(self, call: ToolCall) -> str:
        return await self._execute(call.arguments["query"])

    async def _execute(self, sql: Any) -> str:
        if not isinstance(sql, str) or not sql.strip():
            return "Error: 'query' must be a non-empty SQL statement."
        self.metrics["sql_statements"] += 1
        try:
            text = format_rows(await self.db.execute(sql))
        except StatementTimeout as e:
            self.metrics["sql_timeouts"] += 1
            text = f"Error: {e}"
        except ConnectionLost as e:
            await self._check_server(e)
            self.metrics["sql_errors"] += 1  # the agent killed its own connection
            text = f"Error: {e}"
        except SQLError as e:
            self.metrics["sql_errors"] += 1
            text = f"Error: {e}"
        except ServerUnavailable as e:
            raise TaskError(f"db task: {e}") from e
        return truncate(text, self.task.max_output_chars)

    async def tool_commit_final_answer(self, call: ToolCall) -> StepResult:
        answers = call.arguments["answers"]
        if is_hash_scored(self.item):
            try:
                digest = await self.db.table_hash(self.tables)
            except SQLError as e:  # the agent's tables cannot be hashed: not the expected tables
                logger.info("db task: hashing the tables failed: %s", e)
                digest = None
            except ServerUnavailable as e:
                raise TaskError(f"db task: {e}") from e
            await self._check_server(None)
            correct = digest is not None and digest == expected_hash(self.item["answer_md5"])
        else:
            correct = answers_match(answers, self.item["label"])
        self.metrics["correct"] = correct
        return StepResult(messages=[tool_reply(call, "Answer committed.")], status=SampleStatus.COMPLETED,
                          reward=float(correct), metrics=self.step_metrics())

    async def _check_server(self, cause: Exception | None) -> None:
        """Raise TaskError if the server died (and perhaps came back, maybe without the latest changes) since the
        session's database was made, or does not answer now."""
        task = self.task
        if task.server_starts != self.server_starts or task.restarting or not await task.backend.alive():
            raise TaskError("db task: the MySQL server died during the session" + (f" ({cause})" if cause else ""))

    async def close(self) -> None:
        db, self.db = self.db, None
        if db is not None:
            await db.close()


@register_task("db")
class DBBenchTask(Task):
    """The DBBench task family.

    Args:
        backend: ``sqlite`` (embedded, SELECT-like items only) or ``mysql`` (MySQL-compatible server, all items).
        mysql_url: ``mysql://user:password@host:port`` of an existing server (an account that may create databases
            and users); without it, ``backend: mysql`` starts a private MariaDB server.
        data: A DBBench ``.jsonl``/``.json`` file; the vendored AgentBench dev split by default.
        max_rounds: Assistant messages per episode (upstream: 15).
        statement_timeout: Seconds one SQL statement may run.
        max_output_chars: Characters of a result shown to the agent (upstream: 800).
        max_threads: Threads running the blocking database driver (about the worker's concurrency).
        admin_timeout: ``mysql``: seconds any statement of the task itself (create, score, drop) may run or wait.
    """

    def __init__(self, backend: str = "sqlite", mysql_url: str | None = None, data: str | None = None,
                 max_rounds: int = 15, statement_timeout: float = 10.0, max_output_chars: int = 800,
                 max_threads: int = 64, admin_timeout: float = 30.0) -> None:
        if backend not in ("sqlite", "mysql"):
            raise ValueError(f"db task: backend must be 'sqlite' or 'mysql', got {backend!r}")
        if mysql_url and backend != "mysql":
            raise ValueError("db task: mysql_url is given but backend is 'sqlite'; set backend: mysql")
        if max_rounds < 1 or max_output_chars < 1:
            raise ValueError(f"db task: max_rounds ({max_rounds}) and max_output_chars ({max_output_chars}) must "
                             "be >= 1")
        self.backend_name = backend
        self.mysql_url = mysql_url
        self.max_rounds = max_rounds
        self.statement_timeout = statement_timeout
        self.max_output_chars = max_output_chars
        self.max_threads = max_threads
        self.admin_timeout = admin_timeout
        self.items = [validate_item(item) for item in load_items(data)]
        self.server = None
        self.backend: Backend | None = None
        self._restarting: asyncio.Future[bool] | None = None
        self.server_starts = 0

    def indices(self) -> list[Index]:
        return [i for i, item in enumerate(self.items) if self._servable(item)]

    def _servable(self, item: dict[str, Any]) -> bool:
        if self.backend_name == "mysql":
            return mysql_loadable(item)
        return not is_hash_scored(item)

    def expert(self, index: Index, messages: list[Message]) -> Message:
        """The item's reference statement, then its label as the answer (a table change is scored by the tables' hash:
        its answer list stays empty). The expert knows the answer, as a demonstrator does: upstream's reference
        statements are MySQL's and often do not give the label (on SQLite 3 of the 20 questions do)."""
        item = self.items[int(index)]
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn == 0:
            return assistant_tool_call("execute_sql", {"query": item["sql"]["query"]}, call_id="call_0")
        answers = [] if is_hash_scored(item) else [str(value) for value in item["label"]]
        return assistant_tool_call("commit_final_answer", {"answers": answers}, call_id=f"call_{turn}")

    async def setup(self) -> None:
        if self.backend_name == "sqlite":
            self.backend = SQLiteBackend(self.statement_timeout, self.max_threads)
        else:
            url = self.mysql_url
            if url is None:
                from env_adapters.sandbox.mariadb import MariaDBServer

                # Started on the event-loop thread, which lives as long as the task (the server gets SIGKILL when
                # the thread that started it ends, so that it never outlives a killed worker).
                self.server = MariaDBServer().start()
                loop = asyncio.get_running_loop()
                self.server.on_exit = lambda code: loop.call_soon_threadsafe(self._restart_server)
                url = self.server.url
            self.backend = MySQLBackend(url, self.statement_timeout, self.max_threads, self.admin_timeout)
        await self.backend.start()
        skipped = len(self.items) - len(self.indices())
        if skipped:
            logger.info("db task (%s backend): %d of %d items not served (%s)", self.backend_name, skipped,
                        len(self.items), "empty column names" if self.backend_name == "mysql" else
                        "hash-scored items need backend: mysql")

    @property
    def restarting(self) -> bool:
        """Whether a restart of the server is under way."""
        return self._restarting is not None and not self._restarting.done()

    def _restart_server(self) -> asyncio.Future[bool]:
        """Restart our MariaDB server unless it runs (once, whoever asks meanwhile); resolves to success."""
        if self._restarting is None or self._restarting.done():
            self._restarting = asyncio.ensure_future(self._relaunch())
        return self._restarting

    async def _relaunch(self) -> bool:
        from env_adapters.sandbox.mariadb import MariaDBError

        server = self.server
        if server is None:
            return False
        # Unreachable while our process still looks alive: it was killed a moment ago and its exit has not been
        # seen yet (the kernel's tear-down and the watcher's reaping take a while on a loaded machine).
        for _ in range(EXIT_SEEN_POLLS):
            if not server.running:
                break
            await asyncio.sleep(0.05)
        else:
            return True
        logger.warning("db task: the MariaDB server died; restarting it on port %s", server.port)
        self.server_starts += 1
        try:
            server.relaunch()  # on the event-loop thread, as in setup()
            await asyncio.to_thread(server.wait_ready)
        except MariaDBError:
            logger.exception("db task: restarting the MariaDB server failed")
            return False
        logger.info("db task: MariaDB server restarted (pid %d)", server.pid)
        return True

    async def healthy(self) -> bool:
        """Whether the database server answers; a dead server of our own is restarted first (once, if it failed
        before)."""
        if self.backend is None:
            return False
        if self.server is not None and not self.server.running and not await asyncio.shield(self._restart_server()):
            return False
        return await self.backend.alive()

    async def open_database(self, tables: Sequence[Table]) -> Database:
        """A fresh database for a session; waits for a restart of the server if it is down.

        Raises:
            TaskError: the server cannot be reached (and is not ours to restart, or did not come back).
        """
        try:
            return await self.backend.open(tables)
        except ServerUnavailable as e:
            if self.server is None or not await asyncio.shield(self._restart_server()):
                raise TaskError(f"db task: {e}") from e
        try:
            return await self.backend.open(tables)
        except ServerUnavailable as e:
            raise TaskError(f"db task: {e}") from e

    async def teardown(self) -> None:
        if self.server is not None:
            self.server.on_exit = None
            if self._restarting is not None:
                self._restarting.cancel()
        if self.backend is not None:
            if self.backend.open_databases:
                logger.warning("db task teardown with %d session databases still open", self.backend.open_databases)
            await self.backend.stop()
            self.backend = None
        if self.server is not None:
            self.server.stop()
            self.server = None

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> DBBenchSession:
        if index == -1 and custom_task is not None:
            try:
                item = validate_item(custom_task)
            except ValueError as e:
                raise TaskError(str(e)) from e
        elif isinstance(index, int) and 0 <= index < len(self.items):
            item = self.items[index]
        else:
            raise TaskError(f"db task: index {index!r} out of range 0..{len(self.items) - 1}")
        if self.backend is None:
            raise TaskError("db task: setup() has not run (or teardown() already has)")
        if not self._servable(item):
            raise TaskError(f"db task: item {index!r} cannot be served by the {self.backend_name} backend: "
                            + ("MySQL rejects its empty column name" if self.backend_name == "mysql" else
                               f"it is scored by the table hash (type {item['type'][0]}), which needs backend: mysql"))
        return DBBenchSession(self, item)
