"""``agentrl-env up CONFIG --ray [ADDRESS]``: the environment stack on a Ray cluster, one actor per process.

Each process of the stack (the controller, every worker replica) is owned by a :class:`ProcessHost` actor: the actor
starts it on its node, ends when it ends (so that Ray restarts the actor, and with it the process, up to
``ray.max_restarts`` times), and takes it down when the actor goes (the process gets SIGTERM when its parent dies,
so a task tears its sessions and containers down). The actors belong to the driver that started the stack: when
the ``up`` command or the training run ends, for any reason, Ray removes them.

Placement is per worker entry of the stack YAML (ignored without ``--ray``)::

    workers:
      - {task: os, replicas: 8, ray: {num_cpus: 1, resources: {docker: 1}}}   # only on nodes that offer "docker"
      - {task: calc, replicas: 4, ray: {memory: 2147483648}}

Replicas of an entry are spread over the nodes that meet its requirements (Ray's ``SPREAD`` strategy). Nodes declare
custom resources at ``ray start --resources '{"docker": 64}'``; a local cluster that this module starts offers
``docker`` when this machine's Docker daemon answers. Each worker binds its own node's address and announces it, with
its node's id (``list_workers`` shows it); OS workers use their node's Docker daemon. The controller runs on the
driver's node. A stack on a cluster of more than one node needs a token (``controller.token`` or ``token_file``),
since its processes talk across hosts.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from env_adapters.http import is_loopback
from env_adapters.launcher import (
    STOP_GRACE_S,
    EnvStack,
    RayPlacement,
    StackStartError,
    child_env,
    remove_killed_containers,
)
from env_adapters.sandbox.containers import DOCKER_RESOURCE, docker_available
from env_adapters.sandbox.servers import term_with_parent
from env_adapters.task import get_task_class

logger = logging.getLogger(__name__)

NODE_IP = "{node_ip}"
"""Placeholder in a process's arguments for the address of the node its actor landed on."""
NODE_ID = "{node_id}"
"""Placeholder for that node's Ray id."""
TAIL_LINES = 50
"""Lines of a process's output its actor keeps for error messages (all of it is in Ray's logs)."""
CALL_TIMEOUT_S = 30.0
"""How long a call to a host actor may wait before the actor counts as unreachable for that call."""


class ProcessHost:
    """A Ray actor owning one process of the stack on its node (decorated with ``ray.remote`` at use).

    The process's output goes to the actor's stderr, so Ray keeps it with the actor's logs and streams it to the
    driver (prefixed with the actor); the last lines are kept for :meth:`tail`.

    Args:
        command: The process's command; :data:`NODE_IP` and :data:`NODE_ID` are replaced by this node's.
        url_file: For the controller: the file it writes its URL to, read back by :meth:`url`.
        token_env: The stack's token for the process's environment (see :func:`~env_adapters.launcher.child_env`).
    """

    def __init__(self, command: list[str], url_file: str | None = None,
                 token_env: dict[str, str] | None = None) -> None:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.url_file, self._stopping, self._last = url_file, False, collections.deque(maxlen=TAIL_LINES)
        command = [a.replace(NODE_IP, self.node_ip).replace(NODE_ID, self.node_id) for a in command]
        self.proc = subprocess.Popen(command, env=child_env(token_env or {}), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="replace",
                                     # SIGTERM when the actor dies, however it dies, so its task tears down (the
                                     # signal follows the forking thread: an actor runs on its main one).
                                     preexec_fn=term_with_parent)
        self._reader = threading.Thread(target=self._relay_output, daemon=True)
        self._reader.start()
        threading.Thread(target=self._exit_with_process, daemon=True).start()

    def _relay_output(self) -> None:
        for line in self.proc.stdout:
            self._last.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()

    def _exit_with_process(self) -> None:
        code = self.proc.wait()
        self._reader.join(timeout=5)
        if not self._stopping:
            # The actor ends with its process, so that Ray restarts both (or reports the actor dead for good).
            print(f"stack process {self.proc.pid} exited with code {code}; its actor exits", file=sys.stderr,
                  flush=True)
            os._exit(1)

    def where(self) -> dict[str, Any]:
        """The node and pid of the process."""
        return {"node_id": self.node_id, "node_ip": self.node_ip, "pid": self.proc.pid}

    def url(self, timeout: float) -> str:
        """The controller's URL once it serves (read from its URL file on this node)."""
        path, deadline = Path(self.url_file), time.monotonic() + timeout
        while not path.exists() or not path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise StackStartError(f"controller {'exited' if self.proc.poll() is not None else 'did not start'}:"
                                      f"\n{self.tail()}")
            time.sleep(0.05)
        url = path.read_text().replace("//0.0.0.0:", f"//{self.node_ip}:")
        path.unlink()
        return url

    def tail(self, lines: int = 15) -> str:
        """The last lines of the process's output."""
        return "\n".join(list(self._last)[-lines:]) or "(no output)"

    def kill_process(self) -> None:
        """SIGKILL the process (fault injection): the actor exits with it and Ray restarts both."""
        self.proc.kill()

    def stop(self, grace: float) -> int:
        """SIGTERM the process, SIGKILL it after ``grace`` seconds; its exit code."""
        self._stopping = True
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            remove_killed_containers()
            return code


class RayProcess:
    """The driver's handle of one :class:`ProcessHost`, shaped like the ``subprocess.Popen`` that :class:`EnvStack`
    drives: :meth:`poll` is ``None`` while Ray keeps the actor (also while it restarts it), an exit code once Ray gave
    up on it."""

    def __init__(self, actor: Any) -> None:
        self.actor, self.returncode = actor, None
        self._probe: Any = None  # the one liveness call in flight, so that calls never pile up on a pending actor

    def poll(self) -> int | None:
        import ray

        if self.returncode is not None:
            return self.returncode
        if self._probe is None:
            self._probe = self.actor.where.remote()
        ready, _ = ray.wait([self._probe], timeout=0)
        if ready:
            probe, self._probe = self._probe, None
            try:
                ray.get(probe)
            except ray.exceptions.ActorDiedError:
                self.returncode = 1  # restarts used up, or the actor could not be placed again
            except ray.exceptions.ActorUnavailableError:
                pass  # restarting
        return self.returncode

    def call(self, method: str, *args: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        """Call ``method`` of the actor and wait for its result."""
        import ray

        return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout)



def stop_all(procs: list[RayProcess], grace: float = STOP_GRACE_S) -> None:
    """Stop the processes at once (SIGTERM, SIGKILL after ``grace``), then remove their actors, also those that
    cannot be reached."""
    import ray

    pending = {p.actor.stop.remote(grace): p for p in procs}
    for ref, proc in pending.items():
        try:
            proc.returncode = ray.get(ref, timeout=grace + CALL_TIMEOUT_S)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
            logger.warning("could not stop a stack process cleanly (%s); removing its actor", type(e).__name__)
        ray.kill(proc.actor, no_restart=True)
        proc.returncode = 1 if proc.returncode is None else proc.returncode


def _admits(node: dict[str, Any], placement: RayPlacement) -> bool:
    """Whether ``node`` (an entry of ``ray.nodes()``) offers every custom resource ``placement`` requires."""
    return all(node["Resources"].get(k, 0) >= v for k, v in placement.resources.items())


class RayEnvStack(EnvStack):
    """:class:`EnvStack` with every process owned by a Ray actor (see the module docstring).

    Args:
        config: A stack config dict or the path of a YAML file.
        address: The Ray cluster to use (``ray.init``'s ``address``); ``None``: the one this process is connected
            to, else a new local one.
        startup_timeout: Seconds to wait for the controller and every worker to register.
        command: How to run ``agentrl-env`` on the nodes (default: this Python's ``-m env_adapters.cli``, which
            every node must have at the same path, as Ray's workers do).
    """

    def __init__(self, config: Any, *, address: str | None = None, startup_timeout: float = 60.0,
                 command: list[str] | None = None) -> None:
        super().__init__(config, startup_timeout=startup_timeout, command=command, inherit=True)
        self.address = address
        self._own_ray, self._bind = False, "127.0.0.1"

    def _connect(self) -> None:
        import ray

        if not ray.is_initialized():
            local = self.address is None and not os.environ.get("RAY_ADDRESS")
            resources = {DOCKER_RESOURCE: 1024} if local and docker_available() else None
            ray.init(address=self.address, resources=resources, namespace="agentrl_env")
            self._own_ray = True
        nodes = [n for n in ray.nodes() if n["Alive"]]
        spec = self.config.controller
        if len(nodes) > 1 and not self.token and not spec.allow_no_token:
            raise StackStartError(f"the Ray cluster has {len(nodes)} nodes, so the stack's processes talk across "
                                  "hosts: set controller.token_file (or controller.token) in the stack config, or "
                                  "controller.allow_no_token: true on a trusted network")
        hosts = {n["NodeManagerAddress"] for n in nodes}
        if len(hosts) > 1 and is_loopback(spec.host):
            raise StackStartError(f"controller.host is {spec.host}, which the workers on the cluster's other hosts "
                                  f"({', '.join(sorted(hosts))}) cannot reach: set controller.host: 0.0.0.0 (with a "
                                  "token)")
        # Workers listen where the controller reaches them: their node's address once the stack spans hosts.
        self._bind = NODE_IP if len(hosts) > 1 else "127.0.0.1"
        self._check_docker(nodes)

    def _check_docker(self, nodes: list[dict[str, Any]]) -> None:
        """Refuse a placement that may put a replica of a Docker family (``Task.needs_docker``) on a node whose
        daemon does not answer: each node its resources admit is asked (a probe task pinned there), before anything
        starts. A node that joins later is not asked: a replica there stops at start with an error that names the
        resource to declare."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        entries = [w for w in self.config.workers if get_task_class(w.task).needs_docker]
        admitted = {n["NodeID"] for w in entries for n in nodes if _admits(n, w.ray)}
        if not admitted:
            return
        probe = ray.remote(docker_available)
        refs = {node_id: probe.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id, soft=False)).remote() for node_id in admitted}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=CALL_TIMEOUT_S)
        answers = {node_id: ref in ready and ray.get(ref) for node_id, ref in refs.items()}
        for w in entries:
            silent = [n for n in nodes if _admits(n, w.ray) and not answers[n["NodeID"]]]
            if silent:
                where = ", ".join(f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})" for n in silent)
                raise StackStartError(
                    f"worker entry {w.name or w.task} runs {w.task}, which needs Docker, and its ray.resources "
                    f"{w.ray.resources or '{}'} admit nodes whose Docker daemon does not answer: {where}. Declare a "
                    f"resource only on nodes whose daemon answers (ray start --resources '{{\"{DOCKER_RESOURCE}\": "
                    f"64}}') and require it in the entry (ray: {{resources: {{{DOCKER_RESOURCE}: 1}}}})")

    def start(self) -> str:
        if self.config.openenv is not None:
            raise StackStartError("an `openenv` entry is served beside a stack on one host: with `--ray`, run "
                                  "`agentrl-env openenv --controller URL` next to the controller instead")
        try:
            self._connect()
        except BaseException:
            self.stop()
            raise
        return super().start()

    def _spawn(self, label: str, args: list[str], placement: RayPlacement | None = None,
               url_file: str | None = None) -> RayProcess:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if placement is None:  # the controller: on the driver's node, restarted never (its state is the run's)
            options = {"num_cpus": 0, "max_restarts": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False)}
        else:
            options = {"num_cpus": placement.num_cpus, "resources": placement.resources,
                       "max_restarts": placement.max_restarts, "scheduling_strategy": "SPREAD"}
            if placement.memory is not None:
                options["memory"] = placement.memory
        actor = ray.remote(ProcessHost).options(name=f"{label}-{os.getpid()}-{id(self)}", **options).remote(
            [*self.command, *args], url_file, self._token_env())
        return RayProcess(actor)

    def _worker_args(self) -> list[str]:
        return ["--host", self._bind, "--node", NODE_ID]

    def _tail(self, label: str, lines: int = 15) -> str:
        proc = dict(self.workers).get(label) if label != "controller" else self.controller
        try:
            return proc.call("tail", lines) if proc is not None else "(not started)"
        except Exception:  # noqa: BLE001 - the tail only decorates an error message
            return "(its actor is gone: its output is in Ray's logs, streamed to the driver above)"

    def _start_controller(self) -> None:
        spec = self.config.controller
        url_file = self.log_dir / f"controller-url-{os.getpid()}-{id(self)}"
        self.controller = self._spawn("controller", self._controller_args(url_file), url_file=str(url_file))
        try:
            self.url = self.controller.call("url", self.startup_timeout, timeout=self.startup_timeout + CALL_TIMEOUT_S)
        except StackStartError:
            raise
        except Exception as e:
            raise StackStartError(f"controller did not start ({type(e).__name__}: {e})") from e
        logger.info("controller at %s (host %s)", self.url, spec.host)

    def nodes(self) -> list[dict[str, Any]]:
        """Where each worker process runs: its label, node id, node address and pid (unreachable ones left out)."""
        out = []
        for label, proc in self.workers:
            try:
                out.append({"label": label, **proc.call("where")})
            except Exception:  # noqa: BLE001, S112 - restarting or gone: not placed now
                continue
        return out

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker process ``i`` (fault injection); Ray restarts its actor, which starts it again."""
        import ray

        try:
            self.workers[i][1].call("kill_process")
        except ray.exceptions.RayActorError:  # the actor exits with its process, at times before its reply is sent
            pass

    def stop(self) -> None:
        # Workers first, so that their tasks end their sessions while the controller listens.
        stop_all([p for _, p in self.workers])
        stop_all([self.controller] if self.controller else [])
        self.workers, self.controller = [], None
        if self._own_ray:
            import ray

            ray.shutdown()
            self._own_ray = False

