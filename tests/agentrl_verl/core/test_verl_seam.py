"""Every private verl member in the seam still exists in the installed verl, in the shape agentrl_verl relies on."""

import re
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import verl  # noqa: F401  (loads the plugin first)

import agentrl_verl
from agentrl_verl.core import verl_seam
from agentrl_verl.core.verl_seam import PRIVATE, Private, VerlChanged, check


def test_verl_is_the_pinned_release():
    assert version("verl") == verl_seam.VERL_VERSION, "the seam was written against this verl; re-check every entry"


HERE = [entry for entry in PRIVATE if not verl_seam.needs_vllm(entry)]  # the others: backends/test_vllm_cpu.py


@pytest.mark.parametrize("entry", HERE, ids=[entry.path for entry in HERE])
def test_private_member_is_still_there(entry):
    check(entry)


@pytest.mark.parametrize("entry, message", [
    (Private("verl.trainer.ppo.v1.trainer_base:PPOTrainer._gone", "call", "core.trainer"), "'_gone' is gone"),
    (Private("verl.trainer.ppo.v1.trainer_base:PPOTrainer._compute_advantage", "override", "core.trainer",
             ("self", "data")), "agentrl_verl expects ('self', 'data')"),
    (Private("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer.gone_state", "read", "core.async_trainer"),
     "no longer sets self.gone_state"),
    (Private("verl.trainer.ppo.v1.trainer_base:PPOTrainer.gone_pools", "read", "core.policy_pool",
             set_in="_init_resource_pool_mgr"), "_init_resource_pool_mgr no longer sets self.gone_pools"),
    (Private("verl.no_such_module:X", "call", "core.trainer"), "cannot be imported"),
])
def test_a_changed_member_is_named_with_the_module_to_update(entry, message):
    with pytest.raises(VerlChanged, match="update agentrl_verl.core") as error:
        check(entry)
    assert message in str(error.value) and entry.path in str(error.value)


def _private_names_used(package: Path) -> set[str]:
    """Private attribute names our code reaches on objects it does not define (comments left out)."""
    code = "\n".join(re.sub(r"#.*", "", path.read_text(encoding="utf-8")) for path in package.rglob("*.py"))
    ours = (set(re.findall(r"def (_\w+)", code)) | set(re.findall(r"self\.(_\w+)\s*(?::[^=\n]*)?=(?!=)", code))
            | set(re.findall(r"^\s*(_\w+)\s*[:=]", code, re.M)) | set(re.findall(r"^class (_\w+)", code, re.M)))
    used = set(re.findall(r"\.(_[A-Za-z]\w*)", code)) - ours
    used |= set(re.findall(r"super\(\)\.(_[A-Za-z]\w*)", code))  # overrides that call verl's version
    used |= set(re.findall(r"\b(?!self\b)\w+\.(_[A-Za-z]\w*)\s*=(?!=)", code))  # replaced on a verl object
    return used


def test_every_private_member_used_in_the_package_is_in_the_seam():
    declared = {entry.path.partition(":")[2].rpartition(".")[2] for entry in PRIVATE}
    not_verl = {"_temp_dir",  # ray.init's argument, set through verl's ray_kwargs
                "_custom_ops", "_supports_onednn",  # vLLM's, checked where vLLM runs (backends/test_vllm_cpu.py)
                "_config"}  # multiprocessing's semaphore prefix, checked by backends/test_vllm_cpu.py
    used = _private_names_used(Path(agentrl_verl.__file__).parent) - not_verl
    assert {"_compute_advantage", "_ROLLOUT_REGISTRY", "_engines"} <= used  # the scan sees all three kinds
    assert used <= declared, f"used but not declared in verl_seam.PRIVATE: {sorted(used - declared)}"


def test_accessors_reach_the_registries_the_plugin_filled():
    assert verl_seam.rollout_adapter_registry()[("hf", "async")].endswith("hf_rollout.adapter.HFServerAdapter")
    assert "language_model" in verl_seam.engine_registry()


def test_batch_fields_gives_plain_rows_of_dense_nested_and_object_fields(monkeypatch):
    import types

    import torch

    from agentrl_verl.core.verl_seam import batch_fields

    class Wrapped:  # a dict as TransferQueue may hand it over
        def __init__(self, data):
            self.data = data

    fields = {
        "rm_scores": torch.nested.nested_tensor([torch.tensor([0.0, 1.0]), torch.tensor([0.5]), torch.tensor([2.0])],
                                                layout=torch.jagged),
        "dense": torch.tensor([[1, 2], [3, 4], [5, 6]]),
        "extra_fields": [Wrapped({"a": 1}), {"a": 2}, {"a": 3}],
    }
    fake = types.SimpleNamespace(kv_batch_get=lambda keys, partition_id, select_fields: {k: fields[k]
                                                                                         for k in select_fields})
    monkeypatch.setitem(sys.modules, "transfer_queue", fake)
    batch = types.SimpleNamespace(keys=["k0", "k1", "k2"], partition_id="p",
                                  tags=[{}, {"is_padding": True}, {}])
    out = batch_fields(batch, "rm_scores", "dense", "extra_fields")
    assert out == {"rm_scores": [[0.0, 1.0], [2.0]], "dense": [[1, 2], [5, 6]], "extra_fields": [{"a": 1}, {"a": 3}]}
    assert batch_fields(batch, "rm_scores", padding=True)["rm_scores"] == [[0.0, 1.0], [0.5], [2.0]]
