"""AgentRL on verl: multi-turn agent loop, cross-policy sampling, task-normalised advantages, async training.

Loaded by verl through the ``verl.plugins`` entry point (see :mod:`agentrl_verl.plugin`).
"""

import os

# torch's OpenMP threads (libgomp) spin while they wait for work by default; on a CPU machine that other processes
# share, the spinning threads take the cores the working ones need. On the demo's 2-core machine at load average 7-30,
# the demo's evaluation ran 10-60x slower on 2 spinning threads than on 2 waiting ones (or one thread). libgomp reads
# this once, when torch loads, hence here, before verl imports torch; a value already set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# This process's own threads spin briefly (20000 rounds) before they sleep: most of the work done in the process that
# imports the package first is small ops in one thread (the demo's warm-up and evaluations), and waking a sleeping
# thread for each costs more than the op (a warm-up step of the multi-task preset: 1.01 s passive, 0.68 s so). The
# variable goes again once torch has loaded, so that the processes this one starts (verl's workers) wait passively.
_SPIN = "GOMP_SPINCOUNT"
_spin_set_here = _SPIN not in os.environ
if _spin_set_here:
    os.environ[_SPIN] = "20000"

# Importing verl first loads our plugin, which imports and registers every component. Without this, a user
# who imports a component module before verl would re-enter that half-imported module from the plugin.
import verl  # noqa: E402, F401

if _spin_set_here:
    del os.environ[_SPIN]

__version__ = "0.1.0"
