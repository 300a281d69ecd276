"""Private-server plumbing: a server dies with its owner, and the folder of a dead owner is reaped (with a stand-in
server, ``sleep``, so no database is needed)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from env_adapters.sandbox.servers import (
    free_port,
    owned_folder,
    pid_alive,
    port_taken,
    reap_stale_folders,
    stop_process,
)

PREFIX = "agentrl-test-server-"
# An owner that makes its folder, starts a stand-in server naming the folder on its command line, and waits to be
# killed. argv: prefix, base dir, whether the server gets the parent-death signal.
OWNER = """
import subprocess, sys
from env_adapters.sandbox.servers import die_with_parent, owned_folder
folder = owned_folder(sys.argv[1], sys.argv[2])
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(folder)],
                          preexec_fn=die_with_parent if sys.argv[3] == "1" else None)
(folder / "server.pid").write_text(str(server.pid))
print(folder, server.pid, flush=True)
sys.stdin.read()
"""


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` has ended within ``timeout`` s (a hang guard); a zombie counts as ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def killed_owner(base_dir: Path, die_with_parent: bool) -> tuple[Path, int]:
    """Start an owner, SIGKILL it once its server runs; returns the server's folder and pid."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, PREFIX, str(base_dir), str(int(die_with_parent))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        folder, pid = owner.stdout.readline().split()
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    return Path(folder), int(pid)


def test_server_dies_with_its_owner(tmp_path):
    folder, pid = killed_owner(tmp_path, die_with_parent=True)
    assert gone(pid), "the server outlived its SIGKILLed owner"
    assert folder.exists()


def test_folders_of_dead_owners_are_reaped_with_their_servers(tmp_path):
    stale, server = killed_owner(tmp_path, die_with_parent=False)
    assert not gone(server, timeout=0.2), "without the parent-death signal the server outlives its owner"
    mine = owned_folder(PREFIX, tmp_path)  # the owner (this process) runs: kept
    (mine / "server.pid").write_text(str(server))  # a pid whose command line names another folder: not killed
    other_kind = owned_folder("agentrl-other-", tmp_path)
    try:
        assert reap_stale_folders(PREFIX, "server.pid", tmp_path) == [stale]
        assert gone(server) and not stale.exists()
        assert mine.exists() and other_kind.exists()
        assert reap_stale_folders(PREFIX, "server.pid", tmp_path) == []
    finally:  # no leak if an assertion failed
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def test_stop_process_kills_what_ignores_sigterm():
    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE)
    proc.stdout.readline()  # the handler is in place
    stop_process(proc, timeout=0.2)
    assert proc.returncode == -signal.SIGKILL
    assert not pid_alive(proc.pid)


def test_free_port_can_be_bound():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # raises OSError if the port were taken
        assert s.getsockname()[1] == port


def test_a_port_is_taken_while_a_socket_holds_it_bound_or_listening():
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        assert port_taken(port)
        bound.listen()
        assert port_taken(port)
    assert not port_taken(port)  # closed: free again
