"""AgentRL on verl: multi-turn agent loop, cross-policy sampling, task-normalised advantages, async training.

Loaded by verl through the ``verl.plugins`` entry point (see :mod:`agentrl_verl.plugin`).
"""

import os

# torch's OpenMP threads (libgomp) spin while they wait for work by default; on a CPU machine that other processes
# share, the spinning threads take the cores the working ones need. On the demo's 2-core machine at load average 7-30,
# the demo's evaluation ran 10-60x slower on 2 spinning threads than on 2 waiting ones (or one thread). libgomp reads
# this once, when torch loads, hence here, before verl imports torch; a value already set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The process that imports the package first spins briefly (20000 rounds) before its threads sleep: most of its
# work is small ops in one thread (the demo's warm-up and evaluations), and waking a sleeping thread for each costs
# more than the op (a warm-up step of the multi-task preset: 1.01 s passive, 0.68 s so). Every process it starts
# inherits a spin count of 0, and Ray's workers (``RAY_RAYLET_PID``) never spin: they import this package before
# torch too (to load our classes), and spinning threads in verl's workers took the cores from the working ones (the
# demo's median RL step 17.8 s against 9-12 s). A spin count already set wins, and so does a wait policy other than
# passive.
_SPIN = "GOMP_SPINCOUNT"
_spin_here = (os.environ["OMP_WAIT_POLICY"].upper() == "PASSIVE" and _SPIN not in os.environ
              and "RAY_RAYLET_PID" not in os.environ)
if _spin_here:
    os.environ[_SPIN] = "20000"

# Importing verl first loads our plugin, which imports and registers every component. Without this, a user
# who imports a component module before verl would re-enter that half-imported module from the plugin.
import verl  # noqa: E402, F401

if _spin_here:
    os.environ[_SPIN] = "0"

__version__ = "0.1.0"
