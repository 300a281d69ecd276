"""The MariaDB server manager leaves no process and no folder behind, even when its owner is SIGKILLed."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pymysql
import pytest

from env_adapters.sandbox.mariadb import MariaDBError, MariaDBServer, reap_stale_servers
from env_adapters.sandbox.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.mysql]

OWNER = """
import sys, time
from env_adapters.sandbox.mariadb import MariaDBServer
server = MariaDBServer(base_dir=sys.argv[1]).start()
print(server.pid, server.folder, flush=True)
time.sleep(600)
"""


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def base_dir():
    # Short (the server's unix socket path is limited to 107 bytes) and reachable by the server's user (mysql).
    path = Path(tempfile.mkdtemp(prefix="dbt-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_too_deep_base_dir_is_refused_clearly(tmp_path):
    deep = tmp_path / ("d" * 80)
    deep.mkdir()
    with pytest.raises(MariaDBError, match="too deep"):
        MariaDBServer(base_dir=deep).start()
    assert list(deep.iterdir()) == []


def test_stop_removes_process_and_folder(base_dir):
    with MariaDBServer(base_dir=base_dir) as server:
        pid, folder = server.pid, server.folder
        conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root")
        conn.close()
    assert wait_gone(pid) and not folder.exists()


def test_a_server_whose_port_another_process_took_first_starts_on_another(base_dir, monkeypatch, caplog):
    from env_adapters.sandbox import mariadb

    with socket.socket() as holder:  # took the picked port first: bound, not answering
        holder.bind(("127.0.0.1", 0))
        taken = holder.getsockname()[1]
        picks = iter([taken])
        monkeypatch.setattr(mariadb, "free_port", lambda: next(picks, None) or free_port())
        with caplog.at_level(logging.WARNING, logger="env_adapters.sandbox.servers"), \
                MariaDBServer(base_dir=base_dir) as server:
            assert server.port != taken and server.running
            pymysql.connect(host="127.0.0.1", port=server.port, user="root").close()
    assert f"lost one of its ports [{taken}]" in caplog.text


def test_killed_owner_takes_its_server_along_and_the_folder_is_reaped(base_dir):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(base_dir)], stdout=subprocess.PIPE, text=True)
    try:
        pid, folder = owner.stdout.readline().split()
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert wait_gone(int(pid)), "mariadbd outlived its SIGKILLed owner"
    assert Path(folder).exists()
    assert reap_stale_servers(base_dir) == [Path(folder)]
    assert list(base_dir.iterdir()) == []


def test_server_ignores_an_unwritable_tmpdir(base_dir, monkeypatch):
    private = Path(tempfile.mkdtemp(prefix="dbt-private-", dir="/tmp"))  # mode 0700: the server's user cannot write
    monkeypatch.setenv("TMPDIR", str(private))
    try:
        with MariaDBServer(base_dir=base_dir) as server:
            conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", database="mysql")
            try:
                with conn.cursor() as cursor:
                    # A sort too large for memory spills to the temporary directory.
                    cursor.execute("SET SESSION sort_buffer_size = 32768")
                    cursor.execute("SELECT seq FROM seq_1_to_100000 ORDER BY -seq LIMIT 1")
                    assert cursor.fetchall() == ((100000,),)
                    cursor.execute("SELECT @@tmpdir")
                    assert Path(cursor.fetchone()[0]).is_relative_to(server.folder)
            finally:
                conn.close()
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_a_server_that_dies_is_reaped_and_relaunched_on_its_port(base_dir):
    exits = []
    with MariaDBServer(base_dir=base_dir, on_exit=exits.append) as server:
        pid, port = server.pid, server.port
        os.kill(pid, signal.SIGKILL)
        assert wait_gone(pid), "the killed server was left a zombie"
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exits == [-signal.SIGKILL] and not server.running
        server.relaunch()
        server.wait_ready()
        assert (server.port, server.running) == (port, True) and server.pid != pid
        pymysql.connect(host="127.0.0.1", port=port, user="root").close()
        stopped = server.pid
    assert wait_gone(stopped) and exits == [-signal.SIGKILL]  # a stop is no death
