"""``agentrl-verl make-data``: splits, weights, replication, seeds, and rows verl's RLHFDataset reads."""

from __future__ import annotations

import random
from collections import Counter

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from agentrl_verl.tools.cli import main
from agentrl_verl.tools.data import allocate, build_datasets, replicate, split_indices


def test_split_and_allocate():
    train, val = split_indices(list(range(10)), 0.2, random.Random(0))
    assert len(val) == 2 and sorted(train + val) == list(range(10))
    assert split_indices([5], 0.5, random.Random(0)) == ([5], [])  # a single index stays for training
    assert allocate({"a": 100, "b": 3}, {"a": 1.0, "b": 1.0}, 11) == {"a": 6, "b": 5}
    assert allocate({"a": 100, "b": 3}, {"a": 3.0, "b": 1.0}, 8) == {"a": 6, "b": 2}
    assert allocate({"a": 100, "b": 3}, {"a": 1.0, "b": 0.0}, 5) == {"a": 5}
    with pytest.raises(ValueError, match="positive weight"):
        allocate({"a": 0}, {"a": 1.0}, 5)


def test_replicate_passes_over_every_index():
    out = replicate([1, 2, 3], 7, random.Random(0))
    assert len(out) == 7 and Counter(out[:3]) == Counter(out[3:6]) == Counter([1, 2, 3])


def test_build_datasets_balances_small_tasks():
    task_indices = {"big": list(range(100)), "small": [0, 1, 2, 3, 4]}
    train, val = build_datasets(task_indices, {"big": 1.0, "small": 1.0}, train_size=60, val_fraction=0.2, seed=1)
    counts = Counter(r["data_source"] for r in train)
    assert counts == {"big": 30, "small": 30}
    small_train = {r["extra_info"]["index"] for r in train if r["data_source"] == "small"}
    small_val = {r["extra_info"]["index"] for r in val if r["data_source"] == "small"}
    assert len(small_train) == 4 and len(small_val) == 1 and not small_train & small_val
    assert Counter(r["data_source"] for r in val) == {"big": 20, "small": 1}
    row = train[0]
    assert row["agent_name"] == "agentrl_agent" and row["extra_info"]["split"] == "train"
    assert row["prompt"] == [{"role": "user", "content": f"{row['data_source']} #{row['extra_info']['index']}"}]
    # Same seed, same datasets; another seed, another order.
    assert build_datasets(task_indices, None, 60, 0.2, seed=1) == build_datasets(task_indices, None, 60, 0.2, 1)
    assert build_datasets(task_indices, None, 60, 0.2, seed=2)[0] != train


def test_build_datasets_rejects_bad_input():
    with pytest.raises(ValueError, match=r"unknown task\(s\) \['nope'\]"):
        build_datasets({"a": [1, 2]}, {"nope": 1.0})
    with pytest.raises(ValueError, match="mix index types"):
        build_datasets({"a": [1, 2], "b": ["x", "y"]})


def test_cli_from_config_reads_with_verl_dataset(tmp_path):
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from agentrl_verl.models.tiny import build_tiny_model

    stack = tmp_path / "stack.yaml"
    stack.write_text(yaml.safe_dump({"workers": [{"task": "calc", "name": "calc-a", "options": {"size": 40}},
                                                 {"task": "calc", "name": "calc-b", "options": {"size": 8}}]}))
    out = tmp_path / "data"
    assert main(["make-data", "--config", str(stack), "--task", "calc-a=1", "--task", "calc-b=1", "--out", str(out),
                 "--train-size", "40", "--seed", "3"]) == 0
    train = pd.read_parquet(out / "train.parquet")
    assert Counter(train["data_source"]) == {"calc-a": 20, "calc-b": 20}
    assert len(pd.read_parquet(out / "val.parquet")) == 4 + 1

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 64, "filter_overlong_prompts": True,
                               "return_raw_chat": True})
    dataset = RLHFDataset(str(out / "train.parquet"), tokenizer, config)
    item = dataset[0]
    assert item["agent_name"] == "agentrl_agent" and item["data_source"] in {"calc-a", "calc-b"}
    assert item["index"] == item["extra_info"]["index"]
    assert item["raw_prompt"][0]["content"] == f"{item['data_source']} #{item['index']}"
