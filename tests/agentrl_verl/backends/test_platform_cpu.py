"""The CPU platform and its workarounds; fails loudly where a verl assumption behind them breaks."""

from __future__ import annotations

import inspect
import os
import socket
import tempfile
from importlib.metadata import version

import pytest
import torch
import verl  # noqa: F401  (loads our plugin through the verl.plugins entry point)
from verl.plugin.platform import PlatformBase, PlatformRegistry, get_platform

from agentrl_verl.backends import platform_cpu
from agentrl_verl.backends.platform_cpu import PlatformCPU, accelerator_present
from agentrl_verl.models.tiny import build_tiny_model

pytestmark = pytest.mark.skipif(accelerator_present(), reason="the CPU platform activates only without accelerators")

# PlatformBase's abstract methods in verl 0.9.1: a new one would make PlatformCPU abstract.
EXPECTED_ABSTRACT = {
    "device_name", "vendor_name", "device_module", "is_available", "current_device", "device_count", "set_device",
    "synchronize", "manual_seed", "manual_seed_all", "set_allocator_settings", "empty_cache",
    "get_device_capability", "communication_backend_name", "visible_devices_envvar", "nvtx_range",
    "profiler_start", "profiler_stop", "ray_resource_name", "ray_noset_envvars", "is_ipc_supported", "cudart",
}


def test_verl_is_the_pinned_release():
    assert version("verl") == "0.9.1", "platform_cpu's workarounds were written against verl 0.9.1; re-check them"


def test_platform_is_registered_and_selected_without_accelerator():
    assert PlatformBase.__abstractmethods__ == EXPECTED_ABSTRACT
    assert PlatformRegistry.get("cpu") is PlatformCPU
    platform = get_platform()
    assert isinstance(platform, PlatformCPU)
    assert platform.communication_backend_name() == "gloo"
    assert platform.ray_resource_name() == "GPU"


def test_explicit_selection(monkeypatch):
    monkeypatch.setattr(platform_cpu, "accelerator_present", lambda: True)
    assert not PlatformCPU().is_platform_available(use_smi_check=True)
    monkeypatch.setenv("AGENTRL_PLATFORM", "cpu")
    assert PlatformCPU().is_platform_available(use_smi_check=True)


def test_device_helpers_work_on_cpu():
    from verl.utils.device import get_device_id, get_device_name, get_torch_device

    assert get_device_name() == "cpu"
    assert torch.ones(2).to(get_device_id()).device.type == "cpu"
    device = get_torch_device()
    assert not device.is_available()  # keeps verl's accelerator-memory bookkeeping off
    device.empty_cache()
    device.synchronize()
    free, total = device.mem_get_info()
    assert 0 < free <= total
    assert device.memory_allocated() == 0 and device.max_memory_reserved() == 0
    state = device.get_rng_state()
    device.set_rng_state(state)


def _all_reduce_ones() -> list[float]:
    import torch.distributed as dist

    try:
        tensor = torch.ones(3)
        dist.all_reduce(tensor)
        return tensor.tolist()
    finally:
        dist.destroy_process_group()


def test_distributed_backend_is_plain_gloo(monkeypatch, tmp_path):
    from verl.utils import distributed
    from verl.workers import engine_workers

    assert engine_workers.initialize_global_process_group_ray is distributed.initialize_global_process_group_ray
    store = tmp_path / "explicit"
    monkeypatch.setenv("DIST_INIT_METHOD", f"file://{store}")  # a user's explicit rendezvous is kept
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    distributed.initialize_global_process_group_ray(timeout_second=30)
    assert os.environ["DIST_INIT_METHOD"] == f"file://{store}"
    assert _all_reduce_ones() == [1.0, 1.0, 1.0]


def test_one_rank_group_binds_no_port(monkeypatch, tmp_path):
    from verl.utils import distributed

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as taken:  # verl's MASTER_PORT, taken by someone else before the rank binds it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(taken.getsockname()[1]))
        monkeypatch.delenv("DIST_INIT_METHOD", raising=False)
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "1")
        distributed.initialize_global_process_group_ray(timeout_second=30)
        assert "DIST_INIT_METHOD" not in os.environ
        assert _all_reduce_ones() == [1.0, 1.0, 1.0]
    assert list(tmp_path.iterdir()) == []  # the rendezvous file goes with the group


def test_fsdp_engines_registered_for_cpu():
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry.get_engine_cls("language_model", backend) is FSDPEngineWithLMHead
        assert EngineRegistry.get_engine_cls("value_model", backend) is FSDPEngineWithValueHead


def test_reference_offload_policy_is_unpinned():
    from verl.workers.engine.fsdp import transformer_impl

    source = inspect.getsource(transformer_impl.FSDPEngine._build_fsdp_module)
    assert "CPUOffloadPolicy(pin_memory=True)" in source, "verl changed how it builds the offload policy"
    assert transformer_impl.CPUOffloadPolicy(pin_memory=True).pin_memory is False


def test_value_head_model_loads_without_flash_attention():
    from transformers import AutoConfig
    from verl.utils.model import load_valuehead_model

    assert 'attn_implementation="flash_attention_2"' in inspect.getsource(inspect.unwrap(load_valuehead_model))
    path = build_tiny_model()
    config = AutoConfig.from_pretrained(path)
    config.num_labels = 1
    model = load_valuehead_model(str(path), torch.float32, config, False)
    assert model.config._attn_implementation == "sdpa"
    assert model(torch.tensor([[1, 2, 3]])).logits.shape[-1] == 1


def test_offload_policy_stays_a_class_of_fsdp2s_policy():
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl.workers.engine.fsdp import transformer_impl

    assert isinstance(transformer_impl.CPUOffloadPolicy, type)
    assert isinstance(transformer_impl.CPUOffloadPolicy(), CPUOffloadPolicy)


def test_sdpa_redirect_is_local_to_the_critic_loader():
    from concurrent.futures import ThreadPoolExecutor

    from transformers import AutoModelForCausalLM

    path = build_tiny_model()

    def load_with_flash_attention():
        return AutoModelForCausalLM.from_pretrained(path, attn_implementation="flash_attention_2")

    with pytest.raises((ImportError, ValueError), match="(?i)flash"):  # flash_attn is not installed on CPU hosts
        load_with_flash_attention()
    token = platform_cpu._FLASH_TO_SDPA.set(True)  # as inside load_valuehead_model, in this thread only
    try:
        assert load_with_flash_attention().config._attn_implementation == "sdpa"
        with ThreadPoolExecutor(1) as pool, pytest.raises((ImportError, ValueError), match="(?i)flash"):
            pool.submit(load_with_flash_attention).result()
    finally:
        platform_cpu._FLASH_TO_SDPA.reset(token)


def test_verls_engines_load_later_and_without_their_optional_engine_warnings():
    import subprocess
    import sys

    # A fresh process, all warnings shown: the command loads verl and the plugin, not verl's engines (3.5 s in each
    # Ray worker that never builds one); a worker that does import them gets the CPU engines and no warning about
    # the GPU-only ones.
    probe = ("import sys, agentrl_verl.tools.cli; print('verl.workers.engine' in sys.modules); "
             "import verl.workers.engine; from agentrl_verl.core.verl_seam import engine_registry; "
             "print(all('cpu' in engines.get('fsdp', {}) for engines in engine_registry().values()))")
    result = subprocess.run([sys.executable, "-W", "default", "-c", probe],
                            capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.split() == ["False", "True"], result.stdout
    assert "engine is not available" not in result.stderr, result.stderr
