"""The demo's CPU thread settings: torch's OpenMP threads wait passively, and the demo's own process spins briefly.

torch's OpenMP threads (libgomp) spin while they wait for work by default; on a CPU machine that other processes
share, the spinning threads take the cores the working ones need (on a 2-core machine at load average 7-30, the
demo's evaluation ran 10-60x slower on 2 spinning threads than on 2 waiting ones). The demo's own process (warm-up,
evaluations: mostly small ops in one thread) spins briefly, 20000 rounds, before its threads sleep: waking a sleeping
thread for each op costs more than the op (a warm-up step of the multi-task preset: 1.01 s passive, 0.68 s so). The
processes it starts (verl's driver, Ray's workers, vLLM's) never spin: spinning threads in verl's workers took the
cores from the working ones (the demo's median RL step 17.8 s against 9-12 s).

libgomp reads both settings once, when torch loads, which ``import agentrl_verl`` does (it imports verl): so the
demo's commands re-execute themselves with them (:func:`relaunch_with_demo_threads`) rather than set them after
the fact. These are a shared CPU machine's settings: ``agentrl-verl demo`` with its RL on a GPU does not
re-execute (that would import verl a second time before the first log line), and any process that does not go
through the demo keeps OpenMP's defaults. A wait policy the user set wins, and so does a spin count.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

POLICY_ENV, SPIN_ENV = "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"
DEMO_SPIN = "20000"
_OURS = "AGENTRL_DEMO_THREADS"
"""Set in the re-executed process: ``spin`` where the spin count is the demo's own (not the user's)."""


def demo_thread_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment the demo's process should have started with, or None where it already runs with it.

    Args:
        environ: the process's environment.

    Returns:
        ``environ`` with a passive wait policy and (unless the user set one) the demo's spin count; None where the
        user chose a wait policy or the process was started with these settings.
    """
    if POLICY_ENV in environ or _OURS in environ:
        return None
    if SPIN_ENV in environ:
        return {**environ, POLICY_ENV: "PASSIVE", _OURS: "user"}
    return {**environ, POLICY_ENV: "PASSIVE", SPIN_ENV: DEMO_SPIN, _OURS: "spin"}


def relaunch_with_demo_threads() -> None:
    """Re-execute this command with :func:`demo_thread_environment`'s settings, where it lacks them.

    In the re-executed process, torch has loaded with them, and the demo's spin count is taken out of the environment
    again so that the processes it starts wait passively without spinning (the wait policy stays).
    """
    env = demo_thread_environment(os.environ)
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    if os.environ.pop(_OURS, None) == "spin":
        os.environ.pop(SPIN_ENV, None)
