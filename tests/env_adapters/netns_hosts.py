"""Several hosts on one machine: network namespaces on a private bridge, each running a Ray node (``ray start``).

Each namespace has its own address on a /24 of ``10.213.0.0/16`` that no interface of this machine uses (the
first: ``.11``, the next ``.12``, ...) and its own loopback; the bridge (``.1``, in this machine's own namespace)
joins them, and nothing routes beyond it: traffic goes to loopback or to the bridge's addresses only. Ports are
per namespace, so the Ray nodes use their defaults without meeting the other Ray clusters of the machine. Every
process in a namespace is this cluster's: :meth:`NetnsRayCluster.close` kills them all, then removes the namespaces
and the bridge. Needs root and ``ip`` (iproute2).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PREFIX = "agrl"
"""Names of this module's namespaces and links start with it, then the owning pid."""
RAY_PORT = 6379
START_TIMEOUT_S = 120.0
"""How long one ``ray start`` may take before the cluster counts as broken (a generous bound on a loaded machine)."""
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_prestart_worker_first_driver": "0"}
"""Ray's environment on these hosts: joining nodes and drivers use the head's token (``~/.ray/auth_token``)."""


def available() -> str | None:
    """Why namespaces cannot be made here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip"
    return None


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def _pids(namespace: str) -> list[int]:
    try:
        return [int(p) for p in _ip("netns", "pids", namespace).split()]
    except subprocess.CalledProcessError:
        return []


def remove_stale() -> None:
    """Remove the namespaces and bridges that this module left when their owner was killed (its pid is gone)."""
    names = _ip("netns", "list").split() + [line.split()[0] for line in
                                              _ip("-br", "link", "show", "type", "bridge").splitlines()]
    owners = {m.group(1) for name in names if (m := re.match(rf"{PREFIX}(\d+)", name))}
    for owner in owners:
        if not Path(f"/proc/{owner}").exists():
            _remove(f"{PREFIX}{owner}")


def _remove(prefix: str) -> None:
    """Kill every process in the namespaces named ``<prefix>-*``, then remove them and the bridge ``<prefix>b``."""
    for namespace in [name for name in _ip("netns", "list").split() if name.startswith(f"{prefix}-")]:
        _kill(namespace)
        subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)
    subprocess.run(["ip", "link", "del", f"{prefix}b"], check=False, capture_output=True)


def _kill(namespace: str) -> None:
    """SIGKILL every process in ``namespace`` until none is left (30 s at most)."""
    deadline = time.monotonic() + 30
    while (pids := _pids(namespace)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _free_subnet() -> ipaddress.IPv4Network:
    used = {ipaddress.ip_interface(word).network for line in _ip("-o", "-4", "addr").splitlines()
            for word in line.split() if "/" in word and word[0].isdigit()}
    for third in range(os.getpid() % 200, os.getpid() % 200 + 256):
        subnet = ipaddress.ip_network(f"10.213.{third % 256}.0/24")
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise RuntimeError("no free /24 in 10.213.0.0/16 for the test hosts")


class NetnsRayCluster:
    """A Ray cluster of one node per network namespace (see the module docstring).

    Args:
        resources: One entry per host: the custom resources its node offers (the first is the head).
        num_cpus: Cores each node declares.
        env: Per host index, environment variables of its Ray node (and so of every Ray worker it starts).
    """

    def __init__(self, resources: list[dict[str, float]], num_cpus: int = 1,
                 env: dict[int, dict[str, str]] | None = None) -> None:
        self.prefix = f"{PREFIX}{os.getpid()}"
        subnet = _free_subnet()
        self.bridge_ip = str(subnet[1])
        self.ips = [str(subnet[11 + i]) for i in range(len(resources))]
        self.namespaces = [f"{self.prefix}-{i}" for i in range(len(resources))]
        self.address = f"{self.ips[0]}:{RAY_PORT}"
        self._resources, self._num_cpus, self._env = resources, num_cpus, env or {}
        self._temp = Path(tempfile.mkdtemp(prefix="agrlray-"))  # short: Ray's socket paths have a length limit

    def __enter__(self) -> NetnsRayCluster:
        try:
            self._make_network()
            # `ray start --head` in token mode needs the token to exist already (the suite's other Ray clusters make
            # one at their start, so whether it existed depended on the tests' order).
            subprocess.run([str(Path(sys.executable).with_name("ray")), "get-auth-token", "--generate"],
                           env={**os.environ, **RAY_ENV}, stdout=subprocess.DEVNULL, check=True, timeout=120)
            self._start_nodes(range(1))
            self._start_nodes(range(1, len(self.ips)))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make_network(self) -> None:
        remove_stale()
        bridge = f"{self.prefix}b"
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_ip}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, (namespace, address) in enumerate(zip(self.namespaces, self.ips, strict=True)):
            _ip("netns", "add", namespace)
            _ip("link", "add", f"{self.prefix}v{i}", "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("link", "set", f"{self.prefix}v{i}", "master", bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")

    def popen(self, host: int, command: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``command`` on host ``host`` (in its namespace, with :data:`RAY_ENV`)."""
        env = {**os.environ, **RAY_ENV, **kwargs.pop("env", {})}
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[host], *command], env=env, **kwargs)

    def _start_nodes(self, hosts: range) -> None:
        """Start a Ray node on each of ``hosts`` at once (each in its own temporary folder, so that their socket
        names never meet) and wait until all run. A node that misses Ray's fixed start-up wait (a loaded machine) is
        started once more, as the suite's other clusters are."""
        for attempt in range(2):
            failed = [i for i, log, proc in [self._start_node(i) for i in hosts] if not self._wait_started(log, proc)]
            if not failed:
                return
            from agentrl_verl.pipeline.launch import RAY_START_TIMEOUT  # only here: it imports verl

            logs = {i: (self._temp / f"node{i}.log").read_text()[-3000:] for i in failed}
            if attempt or not all(RAY_START_TIMEOUT in log for log in logs.values()):
                raise RuntimeError(f"ray nodes {failed} did not start:\n" + "\n".join(logs.values()))
            for i in hosts:
                _kill(self.namespaces[i])

    def _start_node(self, i: int) -> tuple[int, Path, subprocess.Popen]:
        ray = str(Path(sys.executable).with_name("ray"))
        where = ["--head", "--port", str(RAY_PORT), "--include-dashboard", "false"] if i == 0 else [
            "--address", self.address]
        shutil.rmtree(self._temp / str(i), ignore_errors=True)
        (self._temp / str(i)).mkdir()
        command = [ray, "start", "--block", *where, "--temp-dir", str(self._temp / str(i)), "--node-ip-address",
                   self.ips[i], "--num-cpus", str(self._num_cpus), "--resources", json.dumps(self._resources[i]),
                   "--object-store-memory", str(100 * 2**20), "--disable-usage-stats"]
        log = self._temp / f"node{i}.log"
        with log.open("w") as out:
            return i, log, self.popen(i, command, stdout=out, stderr=subprocess.STDOUT, env=self._env.get(i, {}))

    @staticmethod
    def _wait_started(log: Path, proc: subprocess.Popen) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def processes(self, host: int) -> list[str]:
        """The command lines of the processes running on host ``host``."""
        out = []
        for pid in _pids(self.namespaces[host]):
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue  # exited meanwhile
        return out

    def close(self) -> None:
        """Kill every process on the hosts (all of them are this cluster's), then remove the network and Ray's
        files."""
        _remove(self.prefix)
        shutil.rmtree(self._temp, ignore_errors=True)
