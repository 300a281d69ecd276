"""Plumbing of private server processes (MariaDB, Virtuoso...) that must never outlive the process owning them.

:class:`OwnedServer` is the base of such a server; the functions are its parts. A server lives in an owned folder
``<prefix><owner pid>-<random>`` (:func:`owned_folder`) on a free loopback port (:func:`free_port`), is started
with :func:`die_with_parent` as its ``preexec_fn`` (it gets SIGKILL when the thread that started it ends, also when
its process is SIGKILLed), and is registered with :func:`stop_at_exit`, so that its ``stop()`` runs at normal exit
and on SIGTERM. The folder of an owner killed anyway is deleted, and its server killed, by
:func:`reap_stale_folders`, which each server calls before it starts.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


_live: weakref.WeakSet[OwnedServer] = weakref.WeakSet()
_exit_hooks_installed = False


def free_port() -> int:
    """A TCP port free on ``127.0.0.1`` right now (only until someone binds it: see
    :meth:`OwnedServer._launch_on_free_ports`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(port: int) -> bool:
    """Whether a socket listens on, or holds, ``port`` on ``127.0.0.1`` now (connections closing do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


PORT_ATTEMPTS = 3
"""Launches of a server on freshly picked ports before losing one of them to another process is an error."""


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """``preexec_fn`` of a server process: it gets ``sig`` when the thread that started it exits (pass another
    signal with ``functools.partial``)."""
    # Runs in the child after fork (after a uid switch, so the kernel keeps the setting through exec).
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def term_with_parent() -> None:
    """:func:`die_with_parent` with SIGTERM, for a child that must tear down (a task worker, a trainer)."""
    die_with_parent(signal.SIGTERM)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (also one of another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owned_folder(prefix: str, base_dir: str | Path | None = None) -> Path:
    """A new folder ``<prefix><this pid>-<random>`` in ``base_dir`` (the system temp dir by default)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base_dir or tempfile.gettempdir()))


def reap_stale_folders(prefix: str, pid_file: str, base_dir: str | Path | None = None) -> list[Path]:
    """Delete the folders made by :func:`owned_folder` whose owner is gone, killing the server of each.

    Args:
        prefix: The folders' prefix (one per kind of server).
        pid_file: Name of the file in a folder holding its server's pid; the pid is killed only while its command
            line names the folder (pids are reused).
        base_dir: Where the folders live; the system temp dir by default.

    Returns:
        The folders removed.
    """
    removed = []
    for folder in Path(base_dir or tempfile.gettempdir()).glob(f"{prefix}*-*"):
        try:
            owner = int(folder.name[len(prefix):].split("-", 1)[0])
        except ValueError:
            continue
        if pid_alive(owner):
            continue
        with contextlib.suppress(OSError, ValueError):
            server_pid = int((folder / pid_file).read_text().strip())
            if str(folder).encode() in Path(f"/proc/{server_pid}/cmdline").read_bytes():
                os.kill(server_pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
        logger.info("removed stale server folder %s (owner pid %d is gone)", folder, owner)
    return removed


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM ``proc``, SIGKILL it after ``timeout`` s, and reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        logger.warning("server pid %d ignored SIGTERM for %.0f s; killing it", proc.pid, timeout)
        proc.kill()
        proc.wait()


def stop_at_exit(server: OwnedServer) -> None:
    """Call ``server.stop()`` at normal exit and on SIGTERM (until :func:`forget`)."""
    _install_exit_hooks()
    _live.add(server)


def forget(server: OwnedServer) -> None:
    """Undo :func:`stop_at_exit` (the server has stopped)."""
    _live.discard(server)


def _stop_all() -> None:
    for server in list(_live):
        server.stop()


def _on_sigterm(signum: int, frame: object) -> None:
    _stop_all()
    # Then die the way SIGTERM would have killed us without the handler.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_exit_hooks() -> None:
    global _exit_hooks_installed
    if _exit_hooks_installed:
        return
    _exit_hooks_installed = True
    atexit.register(_stop_all)
    # Respect a handler someone else installed (uvicorn stops the task, and so the server, on SIGTERM).
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


class OwnedServer(ABC):
    """A server process in an owned folder, on loopback; subclasses start it (``start`` sets :attr:`_proc`).

    Class attributes: ``prefix`` (of its folders, one per kind of server), ``pid_file`` and ``log_file`` (names in
    the folder; the pid file tells :func:`reap_stale_folders` what to kill), ``error`` (the exception it raises).

    Args:
        base_dir: Parent of the folder; the system temp dir by default.
        startup_timeout: Seconds to wait for the server to come up.
    """

    prefix: str
    pid_file: str
    log_file: str
    error: type[Exception] = RuntimeError

    def __init__(self, base_dir: str | Path | None, startup_timeout: float) -> None:
        self.base_dir = Path(base_dir or tempfile.gettempdir())
        self.startup_timeout = startup_timeout
        self.folder: Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        """Process id of the server while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the server has been started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    @abstractmethod
    def start(self) -> Any:
        """Start the server (unless it runs) and return ``self`` once it serves."""

    def _new_folder(self) -> Path:
        """Reap the folders of dead owners, then make this server's folder."""
        reap_stale_folders(self.prefix, self.pid_file, self.base_dir)
        self.folder = owned_folder(self.prefix, self.base_dir)
        return self.folder

    def _log_tail(self) -> str:
        try:
            return (self.folder / self.log_file).read_text(errors="replace")[-2000:]
        except (OSError, TypeError):  # no log yet, or no folder any more
            return "(no log)"

    def _launch_on_free_ports(self, launch: Callable[[], None], ports: Callable[[], list[int | None]]) -> None:
        """Run ``launch`` (it picks ``ports()`` with :func:`free_port`, starts the server and waits until it serves)
        again on fresh ports while the server loses one of them, at most :data:`PORT_ATTEMPTS` times. A port picked
        free stays free only until someone binds it; a server that exited while another process holds one of its
        ports lost that race.

        Raises:
            error: the server failed otherwise, or lost a port on every launch.
        """
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                launch()
                return
            except self.error:
                exited = self._proc is not None and self._proc.poll() is not None
                if attempt == PORT_ATTEMPTS or not exited or not any(p and port_taken(p) for p in ports()):
                    raise
                logger.warning("%s lost one of its ports %s to another process before binding it; starting it on "
                               "others", type(self).__name__, ports())

    def _wait_until(self, ready: Callable[[], bool], what: str) -> None:
        """Poll ``ready()`` until it holds.

        Raises:
            error: the server exited, or ``ready()`` did not hold within ``startup_timeout`` (with the log's end).
        """
        proc = self._proc
        if proc is None:
            raise self.error("the server is not running; call start() first")
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise self.error(f"{Path(proc.args[0]).name} exited with {proc.returncode}: {self._log_tail()}")
            if ready():
                return
            time.sleep(0.05)
        raise self.error(f"{Path(proc.args[0]).name} did not {what} within {self.startup_timeout} s: "
                         f"{self._log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` s) and delete its folder. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, timeout)
        forget(self)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
