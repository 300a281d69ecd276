"""Databases for DBBench sessions: one fresh database per session, in SQLite or a MySQL-compatible server.

A :class:`Backend` is shared by all sessions of a task; :meth:`Backend.open` gives a session its own
:class:`Database`, filled with the item's tables, and :meth:`Database.close` deletes it. Drivers are blocking
(``sqlite3``, ``pymysql``); calls run on the backend's thread pool so that one worker serves many sessions.

Limits, enforced per statement:

- time: ``statement_timeout`` seconds. MySQL: the server's statement time limit, backed by a watchdog that kills
  the query from an admin connection (the agent may change its own session variables); SQLite: a progress
  handler that interrupts the statement.
- rows: at most :data:`MAX_ROWS` rows are fetched. Any 1000 rows print longer than the 800 characters an agent
  sees, so the cap never changes what the agent sees; it only bounds memory.
- isolation: each MySQL session logs in as its own user, granted only on its own database, so statements on other
  databases (``DROP DATABASE other``), global settings or files fail with "access denied"; SQLite databases live
  in memory and ATTACH (which would open files) is refused.

Hash-scored items (INSERT/UPDATE/DELETE) need MySQL's ``md5``/``concat_ws``/``group_concat`` semantics: only
:class:`MySQLBackend` can compute the table hash.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from env_adapters.tasks.dbbench.items import Table
from env_adapters.tasks.dbbench.scoring import combine_table_hashes, quote_identifier, table_hash_query

logger = logging.getLogger(__name__)

MAX_ROWS = 1000
DB_PREFIX = "agentrl_db_"
# Seconds the watchdog waits past the statement timeout before it kills the query itself.
_WATCHDOG_GRACE = 1.0
_INSERT_BATCH = 500
_T = TypeVar("_T")


class SQLError(Exception):
    """A statement failed; the message is shown to the agent."""


class StatementTimeout(SQLError):
    """A statement ran past the statement timeout and was cancelled."""


class HashUnsupported(Exception):
    """The backend cannot compute the table hash that scores INSERT/UPDATE/DELETE items."""


Rows = list[tuple[Any, ...]]


class Database(ABC):
    """The database of one session."""

    @abstractmethod
    async def execute(self, sql: str) -> Rows:
        """Run one statement (committed at once) and return its rows (empty for statements without rows).

        Raises:
            SQLError: the statement failed (syntax, access denied...); StatementTimeout when it ran too long.
        """

    @abstractmethod
    async def table_hash(self, tables: Sequence[Table]) -> str:
        """The content hash of ``tables`` (see :func:`~env_adapters.tasks.dbbench.scoring.table_hash_query`).

        Raises:
            HashUnsupported: the backend lacks MySQL semantics.
        """

    @abstractmethod
    async def close(self) -> None:
        """Delete the database and everything it holds. Idempotent; never raises."""


class Backend(ABC):
    """Creates per-session databases. Shared by all sessions of a task."""

    name: str
    supports_hash: bool

    def __init__(self, statement_timeout: float, max_threads: int) -> None:
        if statement_timeout <= 0:
            raise ValueError(f"statement_timeout must be positive, got {statement_timeout}")
        self.statement_timeout = statement_timeout
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix=f"dbbench-{self.name}")
        self.open_databases = 0

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a blocking driver call on the backend's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Prepare shared resources (connections, servers)."""

    async def stop(self) -> None:
        """Release shared resources; databases still open are the sessions' to close."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    @abstractmethod
    async def open(self, tables: Sequence[Table]) -> Database:
        """A fresh database holding ``tables`` (all columns TEXT)."""


# ---- SQLite ----------------------------------------------------------------------------------------------------


def _sqlite_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sqlite_authorizer(action: int, *_: Any) -> int:
    # ATTACH (also used by VACUUM INTO) would open or create files outside the in-memory database.
    return sqlite3.SQLITE_DENY if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH) else sqlite3.SQLITE_OK


class SQLiteDatabase(Database):
    """An in-memory SQLite database; a statement is interrupted by a progress handler at its deadline."""

    def __init__(self, backend: SQLiteBackend, tables: Sequence[Table]) -> None:
        self._backend = backend
        self._deadline = float("inf")
        self._inflight: asyncio.Future | None = None
        self._conn: sqlite3.Connection | None = sqlite3.connect(":memory:", check_same_thread=False,
                                                                isolation_level=None)
        self._conn.set_authorizer(_sqlite_authorizer)
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 16 * 1024 * 1024)
        self._conn.set_progress_handler(self._over_time, 10_000)
        for table in tables:
            cols = ", ".join(f"{_sqlite_quote(c)} TEXT" for c in table.columns)
            self._conn.execute(f"CREATE TABLE {_sqlite_quote(table.name)} ({cols})")
            marks = ", ".join("?" * len(table.columns))
            self._conn.executemany(f"INSERT INTO {_sqlite_quote(table.name)} VALUES ({marks})", table.rows)

    def _over_time(self) -> int:
        return int(time.monotonic() > self._deadline)

    def _execute(self, sql: str) -> Rows:
        if self._conn is None:
            raise SQLError("the session's database is closed")
        self._deadline = time.monotonic() + self._backend.statement_timeout
        try:
            cursor = self._conn.execute(sql)
            rows = cursor.fetchmany(MAX_ROWS) if cursor.description else []
            cursor.close()
            return rows
        except sqlite3.OperationalError as e:
            if str(e) == "interrupted":
                raise StatementTimeout(
                    f"statement timed out after {self._backend.statement_timeout:g} s and was cancelled") from e
            raise SQLError(str(e)) from e
        except (sqlite3.Error, OverflowError, ValueError) as e:
            raise SQLError(str(e)) from e
        finally:
            self._deadline = float("inf")

    async def execute(self, sql: str) -> Rows:
        self._inflight = asyncio.ensure_future(self._backend.run(self._execute, sql))
        return await asyncio.shield(self._inflight)

    async def table_hash(self, tables: Sequence[Table]) -> str:
        raise HashUnsupported("the table hash of INSERT/UPDATE/DELETE items needs MySQL semantics; "
                              "use backend: mysql")

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # A statement still running (a cancelled session) stops at its next progress check.
            self._deadline = float("-inf")
            if self._inflight is not None:
                await asyncio.wait([self._inflight])
            await self._backend.run(conn.close)
            self._backend.open_databases -= 1


class SQLiteBackend(Backend):
    """Embedded SQLite: no server; SQLite's SQL dialect, and no table hash."""

    name = "sqlite"
    supports_hash = False

    async def open(self, tables: Sequence[Table]) -> Database:
        db = await self.run(SQLiteDatabase, self, tables)
        self.open_databases += 1
        return db


# ---- MySQL / MariaDB -------------------------------------------------------------------------------------------


def parse_mysql_url(url: str) -> dict[str, Any]:
    """pymysql connection arguments from ``mysql://user:password@host:port``.

    Raises:
        ValueError: the URL is not of that form.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("mysql", "mariadb") or not parts.hostname:
        raise ValueError(f"mysql_url {url!r} must look like mysql://user:password@host:port")
    return {
        "host": parts.hostname,
        "port": parts.port or 3306,
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
    }


def _mysql_error(e: Exception) -> SQLError:
    code, message = (e.args + (None, None))[:2] if e.args else (None, str(e))
    return SQLError(f"{code}: {message}" if isinstance(code, int) else str(e))


class MySQLDatabase(Database):
    """A database (and a user granted only on it) in a MySQL-compatible server."""

    # Server error codes of statements stopped by the time limit (MariaDB, MySQL) or by KILL QUERY.
    _TIMEOUT_CODES = {1969, 3024, 1317}

    def __init__(self, backend: MySQLBackend, name: str, conn: Any) -> None:
        self._backend = backend
        self.name = name
        self._conn = conn
        self._inflight: asyncio.Future | None = None

    def _execute(self, sql: str) -> Rows:
        import pymysql

        try:
            with self._conn.cursor() as cursor:
                cursor.execute(sql)
                return list(cursor.fetchmany(MAX_ROWS)) if cursor.description else []
        except pymysql.MySQLError as e:
            if e.args and e.args[0] in self._TIMEOUT_CODES:
                raise StatementTimeout(
                    f"statement timed out after {self._backend.statement_timeout:g} s and was cancelled") from e
            raise _mysql_error(e) from e

    async def execute(self, sql: str) -> Rows:
        if self._conn is None:
            raise SQLError("the session's database is closed")
        fut = self._inflight = asyncio.ensure_future(self._backend.run(self._execute, sql))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self._backend.statement_timeout + _WATCHDOG_GRACE)
        except asyncio.TimeoutError:
            logger.warning("database %s: statement outlived the server's time limit; killing it", self.name)
            await self._backend.admin(f"KILL QUERY {int(self._conn.thread_id())}")
            return await fut
        finally:
            if fut.done():
                self._inflight = None

    async def table_hash(self, tables: Sequence[Table]) -> str:
        hashes = []
        for table in tables:
            rows = await self._backend.admin(table_hash_query(table.name, table.columns), database=self.name)
            hashes.append(rows[0][0] if rows else None)
        return combine_table_hashes(hashes)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(Exception):
            # Stop a statement still running (a cancelled session), so that DROP DATABASE need not wait for it.
            if self._inflight is not None and not self._inflight.done():
                await self._backend.admin(f"KILL {int(conn.thread_id())}")
                await asyncio.wait_for(asyncio.shield(self._inflight), 10)
        with contextlib.suppress(Exception):
            await self._backend.run(conn.close)
        await self._backend.drop(self.name)
        self._backend.open_databases -= 1


class MySQLBackend(Backend):
    """A MySQL-compatible server: MariaDB started by us on loopback, or an existing server given by URL.

    Args:
        url: ``mysql://user:password@host:port`` of an account that may create databases and users and grant on
            them (root of a server started by us).
        statement_timeout: Seconds a statement may run.
        max_threads: Threads for the blocking driver (about the number of concurrent sessions).
    """

    name = "mysql"
    supports_hash = True

    def __init__(self, url: str, statement_timeout: float, max_threads: int) -> None:
        super().__init__(statement_timeout, max_threads)
        self._admin_args = parse_mysql_url(url)
        # Names are unique per backend instance, so that several workers can share one server.
        self._prefix = f"{DB_PREFIX}{secrets.token_hex(4)}_"
        self._counter = itertools.count()
        self._timeout_variable = ""
        self._admin_conn: Any = None
        self._admin_lock = threading.Lock()

    def _connect(self, **overrides: Any) -> Any:
        import pymysql

        args = {**self._admin_args, "autocommit": True, "charset": "utf8mb4", "connect_timeout": 10, **overrides}
        return pymysql.connect(**args)

    def _admin(self, sql: str, params: Sequence[Any] | None = None, database: str | None = None) -> Rows:
        # One admin connection, kept open (a new connection costs ~40 ms) and used by one thread at a time.
        import pymysql

        with self._admin_lock:
            if self._admin_conn is not None:
                try:
                    self._admin_conn.ping(reconnect=False)
                except pymysql.MySQLError:  # the server closed it (restart, idle timeout)
                    self._admin_conn = None
            if self._admin_conn is None:
                self._admin_conn = self._connect()
            try:
                with self._admin_conn.cursor() as cursor:
                    if database is not None:
                        cursor.execute(f"USE {quote_identifier(database)}")
                    cursor.execute(sql, params)
                    return list(cursor.fetchall()) if cursor.description else []
            except Exception:
                # Start afresh next time rather than reuse a connection in an unknown state.
                with contextlib.suppress(Exception):
                    self._admin_conn.close()
                self._admin_conn = None
                raise

    async def admin(self, sql: str, params: Sequence[Any] | None = None, database: str | None = None) -> Rows:
        """Run one statement as the admin account, in ``database`` when given."""
        return await self.run(self._admin, sql, params, database)

    async def start(self) -> None:
        version = (await self.admin("SELECT VERSION()"))[0][0]
        # MariaDB limits any statement in seconds; MySQL only SELECTs, in milliseconds.
        if "mariadb" in version.lower():
            self._timeout_variable = f"SET SESSION max_statement_time = {self.statement_timeout:g}"
        else:
            self._timeout_variable = f"SET SESSION max_execution_time = {int(self.statement_timeout * 1000)}"
        logger.info("DBBench MySQL backend on %s:%s (server %s)", self._admin_args["host"], self._admin_args["port"],
                    version)

    def _create(self, name: str, password: str, tables: Sequence[Table]) -> Any:
        db = quote_identifier(name)
        self._admin(f"CREATE DATABASE {db} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
        self._admin(f"CREATE USER '{name}'@'%%' IDENTIFIED BY %s", (password,))
        self._admin(f"GRANT ALL PRIVILEGES ON {db}.* TO '{name}'@'%%'", ())
        session = self._connect(user=name, password=password, database=name,
                                read_timeout=int(self.statement_timeout + 60))
        try:
            with session.cursor() as cursor:
                for table in tables:
                    cols = ", ".join(f"{quote_identifier(c)} TEXT" for c in table.columns)
                    cursor.execute(f"CREATE TABLE {quote_identifier(table.name)} ({cols})")
                    # Values are escaped by the driver but not passed as parameters: parameter substitution would
                    # also read the '%' of names such as "Win %" as placeholders.
                    for start in range(0, len(table.rows), _INSERT_BATCH):
                        values = ", ".join("(" + ", ".join(session.escape(v) for v in row) + ")"
                                           for row in table.rows[start:start + _INSERT_BATCH])
                        cursor.execute(f"INSERT INTO {quote_identifier(table.name)} VALUES {values}")
                cursor.execute(self._timeout_variable)
                cursor.execute(f"SET SESSION sql_select_limit = {MAX_ROWS}")
        except BaseException:
            session.close()
            raise
        return session

    async def open(self, tables: Sequence[Table]) -> Database:
        name = f"{self._prefix}{next(self._counter)}"
        try:
            conn = await self.run(self._create, name, secrets.token_urlsafe(16), tables)
        except BaseException:
            await self.drop(name)
            raise
        self.open_databases += 1
        return MySQLDatabase(self, name, conn)

    async def drop(self, name: str) -> None:
        """Drop a session's database and user; logs instead of raising."""
        try:
            await self.admin(f"DROP DATABASE IF EXISTS {quote_identifier(name)}")
            await self.admin(f"DROP USER IF EXISTS '{name}'@'%'")
        except Exception:
            logger.exception("could not drop database/user %s; drop it by hand", name)

    async def stop(self) -> None:
        if self._admin_conn is not None:
            with contextlib.suppress(Exception):
                await self.run(self._admin_conn.close)
            self._admin_conn = None
        await super().stop()

    async def leftovers(self) -> list[str]:
        """Databases of this backend that still exist (none once every session has closed)."""
        rows = await self.admin("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
                                (self._prefix.replace("_", r"\_") + "%",))
        return [r[0] for r in rows]
