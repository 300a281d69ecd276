"""The run's stack config and the held-out split of its indices."""

from __future__ import annotations

import pytest

from agentrl_verl.pipeline.settings import TaskSpec, load_pipeline_config
from agentrl_verl.pipeline.stack import Split, resolve_backends, sessions, stack_config


def test_stack_config_takes_a_free_port_and_one_worker_per_task():
    config = stack_config(load_pipeline_config().tasks)
    assert config["controller"]["port"] == 0
    families = ("calc", "db", "os", "kg", "webshop")
    assert [(w["task"], w["name"]) for w in config["workers"]] == [(f, f) for f in families]


def test_the_split_holds_out_each_tasks_first_indices_and_trains_on_the_rest():
    tasks = [TaskSpec("calc", "calc", held_out=2, concurrency=100), TaskSpec("kg", "kg", held_out=1, concurrency=4)]
    split = Split.of({"calc": [0, 1, 2, 3], "kg": ["a", "b"]}, tasks)
    assert split.held_out == {"calc": [0, 1], "kg": ["a"]} and split.train == {"calc": [2, 3], "kg": ["b"]}
    assert sessions(tasks) == {"calc": 64, "kg": 4}  # within the worker's concurrency, at most 64 at once
    with pytest.raises(ValueError, match="task kg has 2 indices, all held out"):
        Split.of({"calc": [0, 1, 2, 3], "kg": ["a", "b"]}, [tasks[0], TaskSpec("kg", "kg", held_out=2)])


@pytest.mark.parametrize(("installed", "backend"), [(True, "mysql"), (False, "sqlite")])
def test_db_backend_auto_takes_mariadb_where_installed_and_says_which(monkeypatch, installed, backend):
    from env_adapters.sandbox import mariadb

    monkeypatch.setattr(mariadb, "mariadb_available", lambda: installed)
    tasks = [TaskSpec("db", "db", options={"backend": "auto", "max_rounds": 4}), TaskSpec("calc", "calc")]
    resolved, notes = resolve_backends(tasks)
    assert resolved[0].options == {"backend": backend, "max_rounds": 4} and resolved[1] == tasks[1]
    assert list(notes) == ["db"] and notes["db"].startswith(f"backend {backend}")
