"""AgentRL on verl: multi-turn agent loop, cross-policy sampling, task-normalised advantages, async training.

Loaded by verl through the ``verl.plugins`` entry point (see :mod:`agentrl_verl.plugin`).
"""

import os

# torch's OpenMP threads (libgomp) spin while they wait for work by default; on a CPU machine that other processes
# share, the spinning threads take the cores the working ones need. On the demo's 2-core machine at load average 7-30,
# the demo's evaluation ran 10-60x slower on 2 spinning threads than on 2 waiting ones (or one thread). libgomp reads
# this once, when torch loads, hence here, before verl imports torch; a value already set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Importing verl first loads our plugin, which imports and registers every component. Without this, a user
# who imports a component module before verl would re-enter that half-imported module from the plugin.
import verl  # noqa: F401

__version__ = "0.1.0"
