"""DBBench (AgentBench): SQL question answering and table modification, on SQLite or a MySQL-compatible server.

Importing this package registers the task family ``db``; see :mod:`env_adapters.tasks.dbbench.task`.
"""

from env_adapters.tasks.dbbench.task import DBBenchTask

__all__ = ["DBBenchTask"]
