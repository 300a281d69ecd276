"""AgentRL on verl: multi-turn agent loop, cross-policy sampling, task-normalised advantages, async training.

Loaded by verl through the ``verl.plugins`` entry point (see :mod:`agentrl_verl.plugin`).
"""

import os

# torch's OpenMP threads (libgomp) spin for a while (GOMP_SPINCOUNT, 300000 by default) before they sleep, waiting for
# work; on a CPU machine that other processes share, the spinning threads take the cores the working ones need (on the
# demo's 2-core machine at load average 7-30 its evaluation ran 10-60x slower than with threads that never spin).
# Threads that never spin (OMP_WAIT_POLICY=PASSIVE) pay a wake-up at every parallel region instead, a third of the
# warm-up's time on an idle machine. A short spin keeps most of both: a warm-up step of the multi-task demo took 0.68
# s (20000) against 1.01 s (passive) and 0.77 s (the default) on the idle 2-core machine, and 5.8-6.0 s against 4.1-5.0
# s (passive) beside four busy processes. libgomp reads this once, when torch loads, hence here, before verl imports
# torch; a value already set wins (OMP_WAIT_POLICY=PASSIVE among them). The RL run's workers wait passively
# (demo.rl_environment): they import torch before this package, and share the cores with each other.
SPIN_COUNT_SET_HERE = "GOMP_SPINCOUNT" not in os.environ
"""Whether ``GOMP_SPINCOUNT`` is this package's default (an explicit one would also hold in the RL run's workers)."""
os.environ.setdefault("GOMP_SPINCOUNT", "20000")

# Importing verl first loads our plugin, which imports and registers every component. Without this, a user
# who imports a component module before verl would re-enter that half-imported module from the plugin.
import verl  # noqa: E402, F401

__version__ = "0.1.0"
