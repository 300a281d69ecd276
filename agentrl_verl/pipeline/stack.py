"""The run's environment stack: its config from the tasks, the indices it serves and their held-out split."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentrl_verl.pipeline.settings import TaskSpec
from env_adapters.protocol import Index

MAX_SESSIONS = 64
"""Episodes of one task played at once by an evaluation (within its worker's concurrency)."""


def stack_config(tasks: Sequence[TaskSpec]) -> dict[str, Any]:
    """An :class:`~env_adapters.launcher.EnvStack` config: the controller on a free loopback port, a worker per task."""
    workers = [{"task": t.family, "name": t.name, "concurrency": t.concurrency, "options": dict(t.options)}
               for t in tasks]
    return {"controller": {"host": "127.0.0.1", "port": 0}, "workers": workers}


async def task_indices(url: str, tasks: Sequence[TaskSpec]) -> dict[str, list[Index]]:
    """Every index the controller at ``url`` serves for each of ``tasks``, by task name."""
    from env_adapters.client import EnvClient

    async with EnvClient(url) as client:
        return {t.name: list(await client.get_indices(t.name)) for t in tasks}


@dataclass(frozen=True)
class Split:
    """Each task's indices: the first ``held_out`` are evaluated only, the rest are demonstrated and trained on."""

    held_out: dict[str, list[Index]]
    train: dict[str, list[Index]]

    @classmethod
    def of(cls, indices: dict[str, list[Index]], tasks: Sequence[TaskSpec]) -> Split:
        """Cut ``indices`` (by task name, as :func:`task_indices` gives them) by each task's ``held_out``.

        Raises:
            ValueError: a task whose indices are all held out (nothing left to train on).
        """
        for t in tasks:
            if len(indices[t.name]) <= t.held_out:
                raise ValueError(f"task {t.name} has {len(indices[t.name])} indices, all held out "
                                 f"(held_out: {t.held_out}); lower held_out")
        return cls({t.name: indices[t.name][: t.held_out] for t in tasks},
                   {t.name: indices[t.name][t.held_out:] for t in tasks})


def resolve_backends(tasks: Sequence[TaskSpec]) -> tuple[list[TaskSpec], dict[str, str]]:
    """``tasks`` with db's ``backend: auto`` resolved: ``mysql`` (a private MariaDB server, every item) where MariaDB's
    server is installed, else ``sqlite`` (the SELECT-like items); and a note per resolved task saying which."""
    from env_adapters.sandbox.mariadb import mariadb_available

    resolved, notes = [], {}
    for task in tasks:
        if task.family == "db" and task.options.get("backend") == "auto":
            backend = "mysql" if mariadb_available() else "sqlite"
            notes[task.name] = ("backend mysql: MariaDB's server is installed" if backend == "mysql" else
                                "backend sqlite: no MariaDB server here (only the SELECT-like items)")
            task = replace(task, options={**task.options, "backend": backend})
        resolved.append(task)
    return resolved, notes


def sessions(tasks: Sequence[TaskSpec]) -> dict[str, int]:
    """Episodes at once per task in an evaluation: the worker's concurrency, at most :data:`MAX_SESSIONS`."""
    return {t.name: min(t.concurrency, MAX_SESSIONS) for t in tasks}
