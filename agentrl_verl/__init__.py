"""AgentRL on verl: multi-turn agent loop, cross-policy sampling, task-normalised advantages, async training.

Loaded by verl through the ``verl.plugins`` entry point (see :mod:`agentrl_verl.plugin`).
"""

# Importing verl first loads our plugin, which registers every component now or when verl imports its registry's
# package; a component module imported before verl then meets the plugin already in place.
import verl  # noqa: F401

__version__ = "0.1.0"
