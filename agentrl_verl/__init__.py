"""AgentRL on verl: multi-turn agent loop, cross-policy sampling, task-normalised advantages, async training.

Loaded by verl through the ``verl.plugins`` entry point (see :mod:`agentrl_verl.plugin`).
"""

# Importing verl first loads our plugin, which imports and registers every component. Without this, a user
# who imports a component module before verl would re-enter that half-imported module from the plugin.
import verl  # noqa: F401

__version__ = "0.1.0"
