"""Databases for DBBench sessions: one fresh database per session, in SQLite or a MySQL-compatible server.

A :class:`Backend` is shared by all sessions of a task; :meth:`Backend.open` gives a session its own
:class:`Database`, filled with the item's tables, and :meth:`Database.close` deletes it. Drivers are blocking
(``sqlite3``, ``pymysql``); calls run on the backend's thread pool so that one worker serves many sessions.

Limits, enforced per statement:

- time: ``statement_timeout`` seconds. MySQL: the server's statement time limit, backed by a watchdog that kills
  the query from an admin connection (the agent may change its own session variables); SQLite: a progress
  handler that interrupts the statement.
- rows: at most :data:`MAX_ROWS` rows (and about :data:`MAX_RESULT_CHARS` characters) are read, one by one, by
  our code, which the agent cannot reconfigure; MySQL then kills the rest of the query. Any 1000 rows print longer
  than the 800 characters an agent sees, so the cap never changes what the agent sees; it only bounds memory.
- isolation: each MySQL session logs in as its own user, granted only on its own database, so statements on other
  databases (``DROP DATABASE other``), global settings or files fail with "access denied"; SQLite databases live
  in memory and ATTACH (which would open files) is refused.

Hash-scored items (INSERT/UPDATE/DELETE) need MySQL's ``md5``/``concat_ws``/``group_concat`` semantics: only
:class:`MySQLBackend` can compute the table hash. It is computed as the session's own user, on base tables only,
after the agent's connection has ended: no view, function or trigger of the agent runs with more rights than the
agent has. A connection the server closed raises :class:`ConnectionLost`; statements of the backend itself raise
:class:`ServerUnavailable` when the server does not answer.
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
MAX_RESULT_CHARS = 1_000_000
DB_PREFIX = "agentrl_db_"
MAX_CONNECT_WAIT_S = 10
"""Longest a new connection waits for the server's greeting (less where the statement's own bound is shorter)."""
# Seconds the watchdog waits past the statement timeout before it kills the query itself.
_WATCHDOG_GRACE = 1.0
_INSERT_BATCH = 500
_T = TypeVar("_T")


class SQLError(Exception):
    """A statement failed; the message is shown to the agent."""


class StatementTimeout(SQLError):
    """A statement ran past the statement timeout and was cancelled."""


class ConnectionLost(SQLError):
    """The session's connection is gone: the server died, or the agent killed its own connection."""


class ServerUnavailable(Exception):
    """The database server cannot be reached or does not answer: not the agent's doing."""


class HashUnsupported(Exception):
    """The backend cannot compute the table hash that scores INSERT/UPDATE/DELETE items."""


Rows = list[tuple[Any, ...]]


class Database(ABC):
    """The database of one session."""

    @abstractmethod
    async def execute(self, sql: str) -> Rows:
        """Run one statement (committed at once) and return its rows (empty for statements without rows).

        Raises:
            SQLError: the statement failed (syntax, access denied...); StatementTimeout when it ran too long;
                ConnectionLost when the server closed the connection.
            ServerUnavailable: the server did not answer a statement of the backend (killing a runaway query).
        """

    @abstractmethod
    async def table_hash(self, tables: Sequence[Table]) -> str | None:
        """The content hash of ``tables`` (see :func:`~env_adapters.tasks.dbbench.scoring.table_hash_query`), or
        None when one of them is missing or is not a base table. Ends the session: no statement runs after it.

        Raises:
            HashUnsupported: the backend lacks MySQL semantics.
            SQLError: hashing failed (the agent changed the columns, or the tables are too large to hash in time).
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

    async def alive(self) -> bool:
        """Whether the backend can serve (a server answers)."""
        return True

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

    async def table_hash(self, tables: Sequence[Table]) -> str | None:
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


# Client errors of a connection that is gone: cannot connect, server has gone away, lost during a query,
# connection closed by the server.
_CONNECTION_LOST_CODES = {2003, 2006, 2013, 2055}


def _connection_lost(e: BaseException) -> bool:
    import pymysql

    return isinstance(e, pymysql.err.InterfaceError) or (
        isinstance(e, pymysql.err.OperationalError) and bool(e.args) and e.args[0] in _CONNECTION_LOST_CODES)


class MySQLDatabase(Database):
    """A database (and a user granted only on it) in a MySQL-compatible server."""

    # Server error codes of statements stopped by the time limit (MariaDB, MySQL) or by KILL QUERY.
    _TIMEOUT_CODES = {1969, 3024, 1317}

    def __init__(self, backend: MySQLBackend, name: str, password: str, conn: Any) -> None:
        self._backend = backend
        self.name = name
        self._password = password
        self._conn = conn
        self._closed = False
        self._inflight: asyncio.Future | None = None

    def _execute(self, sql: str) -> Rows:
        import pymysql

        if self._conn is None:
            raise SQLError("the session's connection has ended (the answer was committed)")
        cursor = self._conn.cursor()  # unbuffered: rows are read one by one, never the whole result
        try:
            cursor.execute(sql)
            if cursor.description is None:
                return []
            rows: Rows = []
            chars = 0
            for row in iter(cursor.fetchone, None):
                if len(rows) == MAX_ROWS or chars > MAX_RESULT_CHARS:
                    # The rest is never read: stop the query rather than drain its result.
                    self._backend.admin_sync(f"KILL QUERY {int(self._conn.thread_id())}")
                    with contextlib.suppress(pymysql.MySQLError):
                        cursor.close()  # reads up to the server's "interrupted"
                    break
                rows.append(row)
                chars += sum(len(v) for v in row if isinstance(v, (str, bytes)))
            return rows
        except pymysql.MySQLError as e:
            if e.args and e.args[0] in self._TIMEOUT_CODES:
                raise StatementTimeout(
                    f"statement timed out after {self._backend.statement_timeout:g} s and was cancelled") from e
            if _connection_lost(e):
                raise ConnectionLost(f"the connection to the database is closed ({_mysql_error(e)})") from e
            raise _mysql_error(e) from e
        finally:
            with contextlib.suppress(pymysql.MySQLError):
                cursor.close()

    async def execute(self, sql: str) -> Rows:
        if self._closed:
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

    def _table_hash(self, tables: Sequence[Table]) -> str | None:
        import pymysql

        # The agent's connection ends first, and with it its locks, its session settings and its temporary tables
        # (which would shadow the base tables); an open transaction is committed, as upstream commits after every
        # statement.
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(pymysql.MySQLError), conn.cursor() as cursor:
                cursor.execute("COMMIT")
            with contextlib.suppress(Exception):
                conn.close()
        # The session's own user scores: whatever the agent defined runs with the agent's rights at most.
        scorer = self._backend.session_connect(self.name, self._password, self._backend.admin_timeout)
        try:
            with scorer.cursor() as cursor:
                cursor.execute("SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = %s",
                               (self.name,))
                kinds = dict(cursor.fetchall())
                if any(kinds.get(table.name) != "BASE TABLE" for table in tables):
                    return None  # dropped, or replaced by a view or a sequence: never executed
                hashes = []
                for table in tables:
                    cursor.execute(table_hash_query(table.name, table.columns))
                    hashes.append(cursor.fetchone()[0])
            return combine_table_hashes(hashes)
        except pymysql.MySQLError as e:
            if _connection_lost(e):
                raise ServerUnavailable(f"the MySQL server stopped answering while scoring ({e})") from e
            raise _mysql_error(e) from e
        finally:
            scorer.close()

    async def table_hash(self, tables: Sequence[Table]) -> str | None:
        """Ends the agent's connection, then hashes the base tables as the session's own user.

        Raises:
            SQLError: hashing failed (the agent changed the columns or its password, or the statement time limit
                ran out).
            ServerUnavailable: the server does not answer.
        """
        return await self._backend.run(self._table_hash, tables)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        answered = True
        if conn is not None:
            # Stop a statement still running (a cancelled session), so that DROP DATABASE need not wait for it.
            if self._inflight is not None and not self._inflight.done():
                try:
                    await self._backend.admin(f"KILL {int(conn.thread_id())}")
                    await asyncio.wait_for(asyncio.shield(self._inflight), 10)
                except ServerUnavailable:
                    answered = False
                except Exception as e:  # noqa: BLE001 - the drop below still runs
                    logger.info("stopping the statement of %s failed: %r", self.name, e)
            with contextlib.suppress(Exception):
                await self._backend.run(conn.close)
        if answered:
            await self._backend.drop(self.name)
        else:  # a stopped server would make the drop wait as long again: the next drop retries it
            self._backend.drop_later(self.name)
        self._backend.open_databases -= 1


class MySQLBackend(Backend):
    """A MySQL-compatible server: MariaDB started by us on loopback, or an existing server given by URL.

    Every statement the backend runs itself (creating, scoring and dropping databases, killing queries) is bounded
    by ``admin_timeout``; admin statements run on a pool of connections, so that a slow one delays no other.

    Args:
        url: ``mysql://user:password@host:port`` of an account that may create databases and users and grant on
            them (root of a server started by us).
        statement_timeout: Seconds a statement of the agent may run.
        max_threads: Threads for the blocking driver (about the number of concurrent sessions).
        admin_timeout: Seconds any statement of the backend itself may run or wait for a lock.
    """

    name = "mysql"
    supports_hash = True

    def __init__(self, url: str, statement_timeout: float, max_threads: int, admin_timeout: float = 30.0) -> None:
        super().__init__(statement_timeout, max_threads)
        if admin_timeout < 1:
            raise ValueError(f"admin_timeout must be >= 1 s, got {admin_timeout}")
        self.admin_timeout = admin_timeout
        self._admin_args = parse_mysql_url(url)
        # Names are unique per backend instance, so that several workers can share one server.
        self._prefix = f"{DB_PREFIX}{secrets.token_hex(4)}_"
        self._counter = itertools.count()
        self._timeout_variable = ""
        self._idle_admin: list[Any] = []
        self._idle_lock = threading.Lock()
        self._undropped: set[str] = set()

    def _connect(self, timeout: float, **overrides: Any) -> Any:
        """A connection with every statement bounded: by the socket (``timeout`` s) and by the server's lock waits."""
        import pymysql

        # A stopped server accepts the connection (the kernel does) and never greets it: bound that wait too.
        connect = max(1, int(min(timeout, self.admin_timeout, MAX_CONNECT_WAIT_S)))
        args = {**self._admin_args, "autocommit": True, "charset": "utf8mb4", "connect_timeout": connect,
                "read_timeout": int(timeout) + 1, "write_timeout": int(timeout) + 1, **overrides}
        try:
            conn = pymysql.connect(**args)
            with conn.cursor() as cursor:
                waits = max(1, int(min(timeout, self.admin_timeout)))
                cursor.execute(f"SET SESSION lock_wait_timeout = {waits}, innodb_lock_wait_timeout = {waits}")
        except pymysql.MySQLError as e:
            if _connection_lost(e):
                raise ServerUnavailable(f"cannot reach the MySQL server at {args['host']}:{args['port']} ({e})") from e
            raise
        return conn

    def session_connect(self, name: str, password: str, timeout: float, **overrides: Any) -> Any:
        """A connection as a session's user to its database, with the agent's statement time limit."""
        conn = self._connect(timeout, user=name, password=password, database=name, **overrides)
        try:
            with conn.cursor() as cursor:
                cursor.execute(self._timeout_variable)
        except BaseException:
            conn.close()
            raise
        return conn

    def admin_sync(self, sql: str, params: Sequence[Any] | None = None) -> Rows:
        """:meth:`admin` for a caller already on the backend's threads."""
        import pymysql

        with self._idle_lock:
            conn = self._idle_admin.pop() if self._idle_admin else None
        if conn is not None:
            try:
                conn.ping(reconnect=False)
            except pymysql.MySQLError:  # the server closed it (restart, idle timeout)
                conn = None
        if conn is None:
            conn = self._connect(self.admin_timeout)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, params)
                rows = list(cursor.fetchall()) if cursor.description else []
        except BaseException as e:
            # Never reuse a connection in an unknown state.
            with contextlib.suppress(Exception):
                conn.close()
            if _connection_lost(e):
                raise ServerUnavailable(f"the MySQL server did not answer {sql.split()[0]} ({e})") from e
            raise
        with self._idle_lock:
            self._idle_admin.append(conn)
        return rows

    async def admin(self, sql: str, params: Sequence[Any] | None = None) -> Rows:
        """Run one statement as the admin account (at most ``admin_timeout`` s).

        Raises:
            ServerUnavailable: the server cannot be reached or did not answer in time.
        """
        return await self.run(self.admin_sync, sql, params)

    async def alive(self) -> bool:
        try:
            # On a thread of its own: behind a full pool of agent statements it would wait for their time limits.
            await asyncio.to_thread(self.admin_sync, "SELECT 1")
        except ServerUnavailable:
            return False
        return True

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
        import pymysql

        db = quote_identifier(name)
        self.admin_sync(f"CREATE DATABASE {db} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
        self.admin_sync(f"CREATE USER '{name}'@'%%' IDENTIFIED BY %s", (password,))
        self.admin_sync(f"GRANT ALL PRIVILEGES ON {db}.* TO '{name}'@'%%'", ())
        # Unbuffered cursors, so that a huge result is never held in memory (see MySQLDatabase._execute).
        session = self.session_connect(name, password, self.statement_timeout + 60,
                                       cursorclass=pymysql.cursors.SSCursor)
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
                # Lets the server stop a plain SELECT at the cap; the agent may lift it, the fetch loop may not.
                cursor.execute(f"SET SESSION sql_select_limit = {MAX_ROWS}")
        except BaseException as e:
            session.close()
            if _connection_lost(e):
                raise ServerUnavailable(f"the MySQL server stopped answering ({e})") from e
            raise
        return session

    async def open(self, tables: Sequence[Table]) -> Database:
        name, password = f"{self._prefix}{next(self._counter)}", secrets.token_urlsafe(16)
        try:
            conn = await self.run(self._create, name, password, tables)
        except BaseException:
            await self.drop(name)
            raise
        self.open_databases += 1
        return MySQLDatabase(self, name, password, conn)

    def _rollback_detached_xa(self) -> None:
        # A transaction that the agent left prepared (XA PREPARE) survives its connection and holds its locks,
        # so that DROP DATABASE would wait for it. Only detached ones can be rolled back from here: those of ended
        # sessions. MariaDB syntax; other servers (or an admin without the right to list them) skip this.
        import pymysql

        try:
            prepared = self.admin_sync("XA RECOVER FORMAT='SQL'")
        except pymysql.MySQLError:
            return
        for row in prepared:
            xid = row[-1].decode() if isinstance(row[-1], bytes) else row[-1]
            with contextlib.suppress(pymysql.MySQLError):
                self.admin_sync(f"XA ROLLBACK {xid}")

    def _wait_disconnected(self, user: str) -> None:
        # A closed connection ends on the server a moment later; until then its prepared transaction is attached.
        deadline = time.monotonic() + self.admin_timeout
        while self.admin_sync("SELECT count(*) FROM information_schema.processlist WHERE user = %s", (user,))[0][0]:
            if time.monotonic() > deadline:
                logger.warning("connections of %s did not end within %g s", user, self.admin_timeout)
                return
            time.sleep(0.01)

    def _drop(self, name: str) -> None:
        self._wait_disconnected(name)
        self._rollback_detached_xa()
        self.admin_sync(f"DROP DATABASE IF EXISTS {quote_identifier(name)}")
        self.admin_sync(f"DROP USER IF EXISTS '{name}'@'%%'", ())

    async def drop(self, name: str) -> None:
        """Drop a session's database and user, and those an earlier drop failed on; logs instead of raising.

        A server that does not answer ends the round at once (each further try would wait ``admin_timeout`` again):
        what is left is retried at the next drop.
        """
        pending = [name, *sorted(self._undropped - {name})]
        for i, one in enumerate(pending):
            try:
                await self.run(self._drop, one)
            except ServerUnavailable as e:
                self._undropped.update(pending[i:])
                logger.warning("could not drop database/user %s (%s); %d left for the next drop", one, e,
                               len(pending) - i)
                return
            except Exception as e:  # noqa: BLE001 - logged; the others are still dropped
                self._undropped.add(one)
                logger.warning("could not drop database/user %s (%s); retried at the next drop", one, e)
            else:
                self._undropped.discard(one)

    def drop_later(self, name: str) -> None:
        """Leave a session's database and user to the next :meth:`drop` (the server did not answer)."""
        self._undropped.add(name)
        logger.warning("database/user %s left for the next drop: the server did not answer", name)

    async def stop(self) -> None:
        with self._idle_lock:
            idle, self._idle_admin = self._idle_admin, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()
        await super().stop()

    async def leftovers(self) -> list[str]:
        """Databases of this backend that still exist (none once every session has closed)."""
        rows = await self.admin("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
                                (self._prefix.replace("_", r"\_") + "%",))
        return [r[0] for r in rows]
