"""Fixtures of the task tests: a MariaDB server shared by the whole session, and tool-call messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from env_adapters.sandbox.mariadb import MariaDBServer, mariadb_available


@pytest.fixture(scope="session")
def mariadb_url():
    """``mysql://root@127.0.0.1:PORT`` of a private MariaDB server, stopped (and its folder deleted) at the end."""
    if not mariadb_available():
        pytest.skip("MariaDB is not installed (apt-get install -y mariadb-server)")
    with MariaDBServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def tool_call() -> Callable[..., dict[str, Any]]:
    """``tool_call(name, **arguments)``: an assistant message calling one tool."""
    from env_adapters.task import assistant_tool_call

    return lambda name, **arguments: assistant_tool_call(name, arguments, call_id=f"call_{name}")


@pytest.fixture
async def mysql_task(mariadb_url):
    """A ``db`` task on the shared MariaDB server (1 s statement timeout), torn down after the test."""
    from env_adapters.task import get_task_class

    task = get_task_class("db")(backend="mysql", mysql_url=mariadb_url, statement_timeout=1.0)
    await task.setup()
    yield task
    await task.teardown()
