"""Environment side of AgentRL: a controller, task workers and task adapters behind one function-call interface.

This package knows nothing of verl, torch or Ray and can be installed alone (``pip install agentrl-verl[env]``).
"""

__version__ = "0.1.0"
