"""A persistent ``bash`` inside a container, driven over one ``docker exec`` stream.

Each command is sent as one line that decodes it from base64 and ``eval``s it in the shell itself, so
``cd``, variables and functions persist between commands, with stdin from ``/dev/null`` (a command that
reads input cannot swallow the next one) and stderr merged into stdout. A command can also be sent as it is
(``raw``), as typed into the shell: then what it starts (``su user``, another ``bash``) reads the commands
that follow. After the command the shell that reads its input prints a sentinel with a per-shell random nonce,
the exit status and its own pid (the one whose descendants a runaway command is among); the reader stops there.

A command that runs past its timeout, or floods more than ``flood_bytes`` of output, is stopped by killing
every descendant of the shell (from a second exec that walks ``/proc``, so it works without procps); the
shell itself survives and prints its sentinel. Background jobs the agent started from the shell die with
it. When even that does not bring the sentinel back (a loop that keeps starting processes), or the command
ended the shell, a fresh shell replaces it. When no process can be started to do any of this (``rm -rf /``
took bash away), or the container stays at its process limit after the kill (a fork bomb's processes
escaped the shell's tree), the shell is declared broken: :class:`ShellBroken`.

:func:`exec_bounded` runs a separate process in the container and keeps a bounded prefix of its output.

Everything here blocks; async callers use ``asyncio.to_thread``.
"""

from __future__ import annotations

import base64
import logging
import re
import secrets
import socket
import struct
import time
from dataclasses import dataclass

import docker

logger = logging.getLogger(__name__)

# Kill every descendant of pid $1 (and $1 itself when $2 is given), then check the pids cgroup. Builtins
# only: no fork is needed, so it also works while a fork bomb holds the pids limit (if the exec itself can
# start). Stop the processes first so that a forking loop cannot outrun the walk, then kill; repeat for
# children forked in between.
_KILL_TREE = r"""
descendants() {
  local -A kids=()
  local s line pid rest ppid todo p
  for s in /proc/[0-9]*/stat; do
    read -r line < "$s" 2>/dev/null || continue
    pid=${s#/proc/}; pid=${pid%/stat}
    rest=${line##*) }; rest=${rest#* }; ppid=${rest%% *}
    kids[$ppid]+=" $pid"
  done
  todo=${kids[$1]}; PIDS=""
  while [ -n "${todo// /}" ]; do
    set -- $todo; p=$1; shift; todo="$* ${kids[$p]}"; PIDS="$PIDS $p"
  done
}
for round in 1 2 3; do
  descendants "$1"
  [ -n "$2" ] && PIDS="$PIDS $1"
  [ -z "${PIDS// /}" ] && break
  kill -STOP $PIDS 2>/dev/null
  kill -KILL $PIDS 2>/dev/null
done
# Exit 3 when the container still sits near its process limit: processes that escaped the shell's tree
# (a fork bomb's orphans) keep it saturated.
for dir in /sys/fs/cgroup /sys/fs/cgroup/pids; do
  if read -r max < "$dir/pids.max" 2>/dev/null && read -r cur < "$dir/pids.current" 2>/dev/null; then
    [ "$max" != max ] && [ $((cur * 10)) -ge $((max * 9)) ] && exit 3
    break
  fi
done
exit 0
"""


class ShellError(Exception):
    """Base class of persistent-shell failures."""


class ShellExited(ShellError):
    """The shell's stream ended (the command ran ``exit`` or killed the shell)."""


class ShellBroken(ShellError):
    """The shell stopped answering even after its command was killed; the container is unusable."""


@dataclass
class CommandResult:
    """Outcome of one command.

    Attributes:
        output: stdout+stderr, decoded (invalid UTF-8 replaced), at most ``keep_bytes`` of it.
        exit_code: The command's exit status (``None`` when it was killed before finishing normally).
        timed_out: Killed because it ran past the timeout.
        flooded: Killed because it printed more than ``flood_bytes``.
        truncated: More output was produced than kept.
        restarted: The shell had to be replaced by a fresh one (see :meth:`PersistentShell.run`).
        seconds: Wall time.
    """

    output: str
    exit_code: int | None
    timed_out: bool = False
    flooded: bool = False
    truncated: bool = False
    restarted: bool = False
    seconds: float = 0.0


class PersistentShell:
    """One long-lived ``bash`` in a running container.

    Args:
        api: Low-level Docker client.
        container_id: A running container that has ``bash`` and ``base64``.
        login: Start ``bash --login`` (reads /etc/profile, like upstream AgentBench).
        ready_timeout: Seconds to wait for the shell's first sentinel.
    """

    def __init__(self, api: docker.APIClient, container_id: str, *, login: bool = True,
                 ready_timeout: float = 10.0) -> None:
        self.api, self.container_id = api, container_id
        self._login, self._ready_timeout = login, ready_timeout
        self._start()

    def _start(self) -> None:
        self._nonce = secrets.token_hex(8)
        self._done = re.compile(rb"\n__AGENTRL_DONE_" + self._nonce.encode() + rb" (-?\d+) (\d+)\n")
        cmd = ["bash", "--login"] if self._login else ["bash"]
        try:
            exec_id = self.api.exec_create(self.container_id, cmd, stdin=True, tty=False)["Id"]
            raw = self.api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as e:
            raise ShellBroken(f"cannot start bash in container {self.container_id[:12]}: {e}") from e
        # docker-py wraps the socket in SocketIO for unix sockets; we need the socket itself for timeouts.
        self._sock: socket.socket = getattr(raw, "_sock", raw)
        self._pending = b""
        # Merge the shell's own stderr (syntax errors of the wrapper) into the stream, silence prompts, and
        # expand aliases as the interactive shell of upstream AgentBench does.
        try:
            self._send("exec 2>&1; PS1=; PS2=; unset HISTFILE; shopt -s expand_aliases\n" + self._sentinel_line())
            result = self._read_until_done(timeout=self._ready_timeout, keep_bytes=256, flood_bytes=1 << 16,
                                           grace=None)
        except ShellExited as e:
            raise ShellBroken(f"bash exited at start in container {self.container_id[:12]}: {e}") from e
        if result is None or result.exit_code is None:
            raise ShellBroken(f"bash did not start in container {self.container_id[:12]}")
        logger.debug("persistent shell pid %d in %s", self.pid, self.container_id[:12])

    def run(self, command: str, *, timeout: float = 30.0, keep_bytes: int = 1 << 16,
            flood_bytes: int = 1 << 20, grace: float = 3.0, raw: bool = False) -> CommandResult:
        """Run ``command`` in the shell and wait for it.

        ``raw`` sends the text as it is, as if typed into the shell (upstream AgentBench runs an item's ``start``
        this way): its stdin is the shell's own input, so a shell it starts (``su user``) reads the commands
        that follow. Otherwise the command is ``eval``-ed with stdin from ``/dev/null``.

        A runaway command is killed (see the module doc). When the shell itself does not come back within
        ``grace`` seconds after that (a loop that keeps starting new processes) or the command ended the shell
        (``exit``), a fresh shell is started and the result says ``restarted``: working directory and variables
        are then back to their defaults.

        Raises:
            ShellBroken: Not even a fresh shell can be started (e.g. the pids limit is exhausted).
        """
        if raw:
            line = command + "\n"
        else:
            encoded = base64.b64encode(command.encode()).decode()
            line = f'{{ eval "$(printf %s {encoded} | base64 -d)"; }} </dev/null 2>&1\n'
        start, exited = time.monotonic(), False
        try:
            self._send(line + self._sentinel_line())
            result = self._read_until_done(timeout=timeout, keep_bytes=keep_bytes, flood_bytes=flood_bytes,
                                           grace=grace)
        except ShellExited:
            result, exited = None, True
        if result is not None:
            return result
        stuck = not exited
        logger.info("restarting the shell in %s (%s)", self.container_id[:12], "stuck" if stuck else "exited")
        if stuck:
            self._kill_tree(include_shell=True)
        self.close()
        self._start()
        return CommandResult("", None, timed_out=stuck, restarted=True, seconds=time.monotonic() - start)

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    # ---- internals -----------------------------------------------------------------------------------

    def _sentinel_line(self) -> str:
        return f"printf '\\n__AGENTRL_DONE_{self._nonce} %d %d\\n' \"$?\" \"$$\"\n"

    def _send(self, text: str) -> None:
        try:
            self._sock.sendall(text.encode())
        except OSError as e:
            raise ShellExited(f"cannot write to the shell: {e}") from e

    def _kill_tree(self, include_shell: bool = False) -> None:
        """Kill every process below the shell (and the shell itself if asked), from a separate exec.

        Raises:
            ShellBroken: The exec cannot start, or the container stays at its process limit afterwards.
        """
        argv = ["bash", "-c", _KILL_TREE, "kill-tree", str(self.pid)] + (["shell"] if include_shell else [])
        try:
            exec_id = self.api.exec_create(self.container_id, argv)["Id"]
            self.api.exec_start(exec_id, detach=True)
            # Bounded wait: the caller's grace period, not this helper, decides when the shell counts as lost.
            deadline = time.monotonic() + 3.0
            while (state := self.api.exec_inspect(exec_id))["Running"] and time.monotonic() < deadline:
                time.sleep(0.05)
        except docker.errors.APIError as e:
            # Typically a fork bomb at the pids limit: no process can start, so nothing can be repaired either.
            raise ShellBroken(f"cannot start a process in container {self.container_id[:12]} to stop the "
                              f"command: {e}") from e
        if state.get("ExitCode") == 3:
            raise ShellBroken(f"container {self.container_id[:12]} stays at its process limit (a fork bomb?)")

    def _read_until_done(self, *, timeout: float, keep_bytes: int, flood_bytes: int,
                         grace: float | None) -> CommandResult | None:
        """Read frames until the sentinel; None when it does not come.

        ``grace``: seconds to wait for the sentinel after killing a runaway command (None: never kill).
        """
        start = time.monotonic()
        deadline = start + timeout
        kept, total, tail = bytearray(), 0, bytearray(self._pending)
        self._pending = b""
        timed_out = flooded = False
        while True:
            match = self._done.search(tail)
            if match:
                before = bytes(tail[: match.start()])
                self._pending = bytes(tail[match.end():])
                kept_room = keep_bytes - len(kept)
                kept += before[: max(kept_room, 0)]
                total += len(before)
                exit_code = None if (timed_out or flooded) else int(match.group(1))
                self.pid = int(match.group(2))
                return CommandResult(kept.decode(errors="replace"), exit_code, timed_out=timed_out, flooded=flooded,
                                     truncated=total > keep_bytes, seconds=time.monotonic() - start)
            # Move everything that cannot be part of a sentinel from the search window into the kept output.
            spill = max(len(tail) - 64, 0)
            if spill:
                chunk = bytes(tail[:spill])
                del tail[:spill]
                kept += chunk[: max(keep_bytes - len(kept), 0)]
                total += len(chunk)
            now = time.monotonic()
            if now >= deadline:
                if grace is None or timed_out or flooded:
                    return None
                timed_out = True
                self._kill_tree()
                deadline = now + grace
            elif total > flood_bytes and not flooded and not timed_out and grace is not None:
                flooded = True
                self._kill_tree()
                deadline = now + grace
            data = self._recv_frame(max(deadline - time.monotonic(), 0.01))
            if data is None:
                continue
            tail += data

    def _recv_frame(self, timeout: float) -> bytes | None:
        """Payload of the next stream frame (stdout and stderr alike); None on timeout."""
        self._sock.settimeout(min(timeout, 1.0))
        try:
            header = self._recv_exact(8)
        except TimeoutError:
            return None
        _, size = struct.unpack(">BxxxL", header)
        self._sock.settimeout(5.0)
        return self._recv_exact(size)

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self._sock.recv(n - len(buf))
            except TimeoutError:
                if not buf:
                    raise
                continue  # mid-frame: the rest is on its way
            except OSError as e:
                raise ShellExited(f"shell stream failed: {e}") from e
            if not chunk:
                raise ShellExited("the shell exited")
            buf += chunk
        return bytes(buf)


@dataclass
class ProcessResult:
    """Outcome of :func:`exec_bounded`.

    Attributes:
        exit_code: The process's exit status (``None`` when it was killed for printing too much).
        output: stdout and stderr as they arrived, at most ``keep_bytes`` of them.
        truncated: The process printed more than ``keep_bytes`` and was killed.
    """

    exit_code: int | None
    output: bytes
    truncated: bool = False


# Print the pid (so that the caller can stop the process), then become `timeout`, the leader of its own
# process group: killing that group stops the process and everything it started.
_BOUNDED = 'echo "$$"; exec timeout "$0" "$@"'


def exec_bounded(api: docker.APIClient, container_id: str, argv: list[str], *, keep_bytes: int,
                 timeout: float) -> ProcessResult:
    """Run ``argv`` as a new process in the container, reading its output as a stream.

    Output past ``keep_bytes`` is not read: the process group is killed instead, so a script that prints
    without end costs neither memory nor time. ``timeout`` seconds bound the process (GNU ``timeout``; its
    exit status 124 when it fires). Arguments are passed as they are.

    Raises:
        docker.errors.APIError: The container is gone or cannot start a process.
    """
    exec_id = api.exec_create(container_id, ["sh", "-c", _BOUNDED, f"{timeout:g}", *argv])["Id"]
    # Demultiplexed: Docker forwards stdout and stderr independently, so stderr may overtake the pid line.
    head, kept, pid, truncated, killed = bytearray(), bytearray(), None, False, False
    for out, err in api.exec_start(exec_id, stream=True, demux=True):
        if out and pid is None:
            head += out
            out = b""
            if b"\n" in head:
                first, _, out = bytes(head).partition(b"\n")
                if not first.strip().isdigit():  # the runtime's own error: no process started (e.g. cwd deleted)
                    raise docker.errors.APIError(f"cannot start a process: {first.decode(errors='replace').strip()}")
                pid = int(first)
        if not truncated:
            kept += (err or b"") + (out or b"")
            if len(kept) > keep_bytes:
                del kept[keep_bytes:]
                truncated = True
        if truncated and pid is not None and not killed:
            # Detached, and the stream drained meanwhile: Docker finishes the killed exec only once its
            # output has been read, and holds back further execs of the container until then.
            killed = True
            api.exec_start(api.exec_create(container_id, ["bash", "-c", f"kill -KILL -{pid}"])["Id"], detach=True)
    code = api.exec_inspect(exec_id)["ExitCode"]
    return ProcessResult(None if truncated else code, bytes(kept), truncated)
