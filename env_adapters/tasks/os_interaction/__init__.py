"""AgentBench OS interaction: a Docker container and a persistent bash per session.

Importing this package registers the task family ``os``; see :mod:`env_adapters.tasks.os_interaction.task`.
"""

from env_adapters.tasks.os_interaction.task import EMPTY_OUTPUT, TRUNCATION_NOTE, OSTask, format_output

__all__ = ["EMPTY_OUTPUT", "TRUNCATION_NOTE", "OSTask", "format_output"]
