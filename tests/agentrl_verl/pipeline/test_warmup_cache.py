"""The keyed warm-up model cache: built once per settings, reused after, never left half-built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl_verl.pipeline.warmup_cache import METADATA, cache_key, cached_warmup


class Build:
    """A warm-up stand-in that writes an HF-like directory and counts its calls (``fail``: raises half-way)."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls, self.fail = 0, fail

    def __call__(self, output: Path) -> dict:
        self.calls += 1
        (output / "config.json").write_text("{}")
        if self.fail is not None:
            raise self.fail
        return {"steps": 400, "success": 0.35, "history": [{"step": 400, "success": 0.35}]}


def test_a_model_is_built_once_per_settings_and_reused_with_its_metadata(tmp_path):
    build = Build()
    first = cached_warmup(tmp_path, "warmup", {"lr": 1e-3}, build)
    again = cached_warmup(tmp_path, "warmup", {"lr": 1e-3}, build)
    assert build.calls == 1 and (first.reused, again.reused) == (False, True)
    assert again.path == first.path == tmp_path / f"warmup-{cache_key({'lr': 1e-3})}"
    assert again.metadata == first.metadata == json.loads((first.path / METADATA).read_text())
    assert again.metadata["steps"] == 400 and again.metadata["history"] == [{"step": 400, "success": 0.35}]
    other = cached_warmup(tmp_path, "warmup", {"lr": 2e-3}, build)
    assert build.calls == 2 and not other.reused and other.path != first.path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.path.name, other.path.name])


def test_the_key_follows_the_settings_not_their_order():
    assert cache_key({"a": 1, "b": [1, 2]}) == cache_key({"b": [1, 2], "a": 1})
    assert cache_key({"a": 1, "b": [1, 2]}) != cache_key({"a": 1, "b": [2, 1]})
    assert len(cache_key({})) == 16


@pytest.mark.parametrize("error", [RuntimeError("no demonstrations"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_build_leaves_nothing_under_the_key(tmp_path, error):
    with pytest.raises(type(error)):
        cached_warmup(tmp_path, "warmup", {"lr": 1e-3}, Build(fail=error))
    assert list(tmp_path.iterdir()) == []
    build = Build()
    assert not cached_warmup(tmp_path, "warmup", {"lr": 1e-3}, build).reused and build.calls == 1
