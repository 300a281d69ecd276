"""Fixtures of the task tests: a MariaDB server shared by the whole session, and tool-call messages."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture(scope="session")
def mariadb_url():
    """``mysql://root@127.0.0.1:PORT`` of a private MariaDB server, stopped (and its folder deleted) at the end."""
    if shutil.which("mariadbd", path="/usr/sbin:/usr/local/sbin:/usr/bin") is None:
        pytest.skip("MariaDB is not installed (apt-get install -y mariadb-server)")
    from env_adapters.sandbox.mariadb import MariaDBServer

    with MariaDBServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def tool_call() -> Callable[..., dict[str, Any]]:
    """``tool_call(name, **arguments)``: an assistant message calling one tool."""

    def make(name: str, **arguments: Any) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        call = {"id": f"call_{name}", "type": "function", "function": function}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    return make
