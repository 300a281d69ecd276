"""A private MariaDB server on loopback, owned by the process that starts it.

:class:`MariaDBServer` initialises a data directory in a fresh temporary folder, starts ``mariadbd`` on a
free loopback port (root with an empty password, reachable only from this machine) and, on :meth:`stop`,
stops the server and deletes the folder. Nothing outlives the owner:

- ``stop`` runs on normal exit (``atexit``) and on SIGTERM (a handler is installed when the process has none);
- the server gets the parent-death signal, so it dies with its owner even when the owner is SIGKILLed;
- the folder of a dead owner is deleted by :func:`reap_stale_servers`, which every ``start`` calls

(the plumbing of :mod:`env_adapters.sandbox.servers`).

A server that dies on its own is reaped at once by a watcher thread (no zombie), which then calls ``on_exit``;
:meth:`MariaDBServer.relaunch` starts it again on the same folder and port, so that clients keep their URL.
The server has its own temporary directory inside the folder: it never depends on the owner's ``$TMPDIR``.

Needs the Debian package ``mariadb-server`` (``mariadb-install-db`` and ``mariadbd`` on PATH or in /usr/sbin).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from env_adapters.sandbox.servers import OwnedServer, die_with_parent, free_port, reap_stale_folders, stop_at_exit

logger = logging.getLogger(__name__)

DIR_PREFIX = "agentrl-mariadb-"
_MAX_SOCKET_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])


class MariaDBError(RuntimeError):
    """The server could not be initialised or started."""


def mariadb_available() -> bool:
    """Whether a MariaDB server can be started here (``mariadbd`` is installed)."""
    return shutil.which("mariadbd", path=_SEARCH_PATH) is not None


def _binary(name: str) -> str:
    path = shutil.which(name, path=_SEARCH_PATH)
    if path is None:
        raise MariaDBError(f"{name!r} not found; install the Debian package 'mariadb-server' (apt-get install -y "
                           "mariadb-server) or give an existing server with mysql_url")
    return path


def reap_stale_servers(base_dir: str | Path | None = None) -> list[Path]:
    """Delete server folders (``agentrl-mariadb-<owner pid>-*``), and kill their servers, whose owner is gone.

    Args:
        base_dir: Where the folders live; the system temp dir by default.

    Returns:
        The folders removed.
    """
    return reap_stale_folders(DIR_PREFIX, "mariadbd.pid", base_dir)


class MariaDBServer(OwnedServer):
    """One MariaDB server in a temporary folder, on ``127.0.0.1`` and a free port.

    Use as a context manager or call :meth:`start` / :meth:`stop`. ``start`` blocks for a few seconds
    (data-directory initialisation and server start-up); call it (and :meth:`relaunch`) from a long-lived thread,
    because the server receives SIGKILL when the thread that started it exits.

    Args:
        base_dir: Parent of the temporary folder; the system temp dir by default.
        startup_timeout: Seconds to wait for the server to accept connections.
        user: System user the server runs as when started by root (``mariadbd`` refuses to run as root).
        on_exit: Called with the exit status when the server dies without :meth:`stop` (from the watcher thread).
    """

    prefix, pid_file, log_file, error = DIR_PREFIX, "mariadbd.pid", "error.log", MariaDBError

    def __init__(self, base_dir: str | Path | None = None, startup_timeout: float = 30.0, user: str = "mysql",
                 on_exit: Callable[[int], None] | None = None) -> None:
        super().__init__(base_dir, startup_timeout)
        self.user = user
        self.on_exit = on_exit
        self.port: int | None = None
        self._as_root = os.geteuid() == 0

    @property
    def url(self) -> str:
        """``mysql://root@127.0.0.1:PORT`` of the running server."""
        if self.port is None:
            raise MariaDBError("the server is not running; call start() first")
        return f"mysql://root@127.0.0.1:{self.port}"

    def start(self) -> MariaDBServer:
        """Initialise a data directory and start the server; returns ``self`` once it accepts connections.

        Raises:
            MariaDBError: a binary is missing, initialisation failed, or the server did not come up in time
                (the message carries the end of the server's error log).
        """
        if self._proc is not None:
            return self
        install_db = _binary("mariadb-install-db")
        _binary("mariadbd")  # fail before creating anything
        self._new_folder()
        if len(os.fsencode(self.folder / "mariadbd.sock")) > _MAX_SOCKET_PATH:
            # mariadbd would listen on TCP, then die when it cannot bind its unix socket.
            shutil.rmtree(self.folder, ignore_errors=True)
            raise MariaDBError(f"base_dir {self.base_dir} is too deep: the server's socket path would exceed "
                               f"{_MAX_SOCKET_PATH} bytes; use a shorter base_dir")
        as_root = self._as_root
        if as_root:
            shutil.chown(self.folder, user=self.user, group=self.user)
        try:
            # The server's own temporary directory: an inherited $TMPDIR may not be writable by its user.
            self._tmpdir.mkdir()
            if as_root:
                shutil.chown(self._tmpdir, user=self.user, group=self.user)
            init_args = [install_db, f"--datadir={self.folder / 'data'}", "--auth-root-authentication-method=normal",
                         "--skip-test-db"]
            if as_root:
                init_args.append(f"--user={self.user}")
            init = subprocess.run(init_args, capture_output=True, text=True, timeout=120, env=self._env())
            if init.returncode != 0:
                raise MariaDBError(f"mariadb-install-db failed ({init.returncode}): {init.stderr[-2000:]}")
            def launch() -> None:
                self.port = free_port()
                self.relaunch()
                self.wait_ready()

            self._launch_on_free_ports(launch, lambda: [self.port])
        except BaseException:
            self.stop()
            raise
        logger.info("MariaDB server pid %d listening on 127.0.0.1:%d (%s)", self._proc.pid, self.port, self.folder)
        return self

    @property
    def _tmpdir(self) -> Path:
        return self.folder / "tmp"

    @property
    def _log(self) -> Path:
        return self.folder / self.log_file

    def _env(self) -> dict[str, str]:
        return {**os.environ, "TMPDIR": str(self._tmpdir)}

    def relaunch(self) -> None:
        """Start ``mariadbd`` on the existing folder and port, without waiting (see :meth:`wait_ready`).

        For a server that died: its data survives (with crash recovery), and clients keep the same URL. Does
        nothing while the server runs.

        Raises:
            MariaDBError: :meth:`start` has not run, or :meth:`stop` has.
        """
        if self.folder is None or self.port is None:
            raise MariaDBError("the server has no folder; call start() first")
        if self.running:
            return
        mariadbd, as_root = _binary("mariadbd"), self._as_root
        self._proc = proc = subprocess.Popen(
            [mariadbd, "--no-defaults", f"--datadir={self.folder / 'data'}", f"--tmpdir={self._tmpdir}",
             f"--socket={self.folder / 'mariadbd.sock'}", f"--pid-file={self.folder / self.pid_file}",
             f"--log-error={self._log}", "--bind-address=127.0.0.1", f"--port={self.port}", "--skip-name-resolve",
             "--skip-log-bin", "--innodb-buffer-pool-size=32M", "--max-connections=500",
             # A throwaway server: durability buys nothing, and fsyncs made each session setup ~5x slower.
             "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0", "--innodb-flush-method=nosync",
             # Each database made and dropped writes Aria's log, which this build never checkpoints (interval 0)
             # and lets reach 1 GiB a file: about 20 MiB an hour under a soak. Checkpoints every 30 s and 8 MiB
             # files let the server delete the log files it is done with.
             "--aria-checkpoint-interval=30", "--aria-log-file-size=8388608"],
            user=self.user if as_root else None, group=self.user if as_root else None, env=self._env(),
            preexec_fn=die_with_parent, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stop_at_exit(self)
        threading.Thread(target=self._watch, args=(proc,), name=f"mariadbd-{proc.pid}-watcher", daemon=True).start()

    def _watch(self, proc: subprocess.Popen) -> None:
        # Reaps the server as soon as it exits (a dead child stays a zombie until its parent waits for it).
        code = proc.wait()
        if proc is self._proc:  # not stopped by us
            logger.error("MariaDB server pid %d exited with %d: %s", proc.pid, code, self._log_tail()[-500:])
            if self.on_exit is not None:
                self.on_exit(code)

    def wait_ready(self) -> None:
        """Block until the server accepts connections.

        Raises:
            MariaDBError: it exited or did not come up within ``startup_timeout`` (with the end of its error log).
        """
        def accepts() -> bool:
            # On its own Unix socket, which mariadbd opens after binding its TCP port: a connection there is this
            # server's (the TCP port could be another process's, one that took it first).
            with socket.socket(socket.AF_UNIX) as s:
                return s.connect_ex(str(self.folder / "mariadbd.sock")) == 0

        self._wait_until(accepts, "accept connections")

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        self.port = None
