"""Fixtures of the task tests: tool-call messages, and a ``db`` task on the session's MariaDB server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


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
