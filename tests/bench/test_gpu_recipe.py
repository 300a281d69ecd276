"""The 1-GPU recipe smoke's environment stack: the recipe's own YAML, cut to what the host can serve."""

from __future__ import annotations

import yaml

from bench.gpu_recipe import RECIPE_STACK, smoke_stack

RECIPE = yaml.safe_load(RECIPE_STACK.read_text())


def test_with_docker_and_mariadb_the_smoke_serves_the_recipes_five_families_on_loopback_with_a_token():
    stack, notes = smoke_stack(RECIPE, "/run/env.token", docker=True, mysql=True)
    assert notes == []
    assert stack["controller"] == {"host": "127.0.0.1", "port": 5020, "token_file": "/run/env.token"}
    assert [w["task"] for w in stack["workers"]] == ["os", "db", "kg", "webshop", "alfworld"]
    assert {w["replicas"] for w in stack["workers"]} == {1}
    for worker, recipe_worker in zip(stack["workers"], RECIPE["workers"], strict=True):
        assert worker["options"] == recipe_worker["options"]
        assert worker["concurrency"] == recipe_worker["concurrency"]
    assert RECIPE["controller"]["host"] == "0.0.0.0" and RECIPE["workers"][0]["replicas"] == 4  # the recipe untouched


def test_without_docker_or_mariadb_os_is_left_out_and_db_runs_on_sqlite_saying_why():
    stack, notes = smoke_stack(RECIPE, "/run/env.token", docker=False, mysql=False)
    assert [w["name"] for w in stack["workers"]] == ["dbbench-std", "kg-std", "webshop-std", "alfworld-std"]
    db = stack["workers"][0]
    recipe_db = next(w for w in RECIPE["workers"] if w["task"] == "db")
    assert db["options"] == {"backend": "sqlite", "max_rounds": recipe_db["options"]["max_rounds"]}
    assert len(notes) == 2
    assert notes[0].startswith("os-std: left out") and "Docker" in notes[0]
    assert notes[1].startswith("dbbench-std: on SQLite") and "mariadb-server" in notes[1]


def test_docker_alone_keeps_os_and_moves_only_db():
    stack, notes = smoke_stack(RECIPE, "t", docker=True, mysql=False)
    assert [w["task"] for w in stack["workers"]][:2] == ["os", "db"]
    assert stack["workers"][1]["options"]["backend"] == "sqlite" and len(notes) == 1
