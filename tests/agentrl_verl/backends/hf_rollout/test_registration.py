"""The hf backend is registered with verl, covers verl's replica/server/adapter method sets, and serves requests."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import uuid

import pytest
import torch
import verl  # noqa: F401  (loads our plugin through the verl.plugins entry point)
from hydra import compose, initialize_config_dir
from verl.workers.rollout import llm_server, replica
from verl.workers.rollout.base import BaseRollout, get_rollout_class
from verl.workers.rollout.replica import RolloutMode, RolloutReplicaRegistry

from agentrl_verl.backends.hf_rollout.adapter import HFServerAdapter, bucketed_sender
from agentrl_verl.backends.hf_rollout.replica import HFReplica
from agentrl_verl.backends.hf_rollout.server import HFRolloutServer
from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.presets import CONFIG_DIR


def test_registered_in_both_verl_registries():
    assert RolloutReplicaRegistry.get("hf") is HFReplica
    assert get_rollout_class("hf", "async") is HFServerAdapter


def test_server_has_every_method_verl_calls_on_servers():
    # Every `server.<method>.remote(` in verl's RolloutReplica, and `generate` from the LLMServerClient.
    called = set(re.findall(r"server\.(\w+)\.remote\(", inspect.getsource(replica.RolloutReplica)))
    called |= set(re.findall(r"server\.(\w+)\.remote\(", inspect.getsource(llm_server.LLMServerClient)))
    assert {"generate", "wake_up", "sleep", "abort_all_requests", "resume_generation"} <= called
    missing = {name for name in called if not callable(getattr(HFRolloutServer, name, None))}
    assert not missing, f"verl now calls {sorted(missing)} on rollout servers; HFRolloutServer lacks them"


def test_adapter_implements_base_rollout():
    assert not BaseRollout.__abstractmethods__ - set(vars(HFServerAdapter)), "BaseRollout has new abstract methods"
    assert not inspect.isabstract(HFServerAdapter)


def test_server_generate_signature_takes_client_kwargs():
    params = inspect.signature(HFRolloutServer.generate).parameters
    for name in ("request_id", "prompt_ids", "sampling_params", "image_data", "video_data"):
        assert name in params


@pytest.fixture(scope="module")
def server():
    path = build_tiny_model()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="cpu_tiny", overrides=[f"actor_rollout_ref.model.path={path}"])
    return HFRolloutServer(cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model, RolloutMode.HYBRID,
                           replica_rank=0, server_name="hf_server_test")


async def test_server_generates_gates_and_updates_weights(server):
    prompt = [5, 6, 7, 8]
    greedy = {"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 6}
    first = await server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="a")
    assert first.stop_reason == "completed" and len(first.token_ids) == 6 and len(first.log_probs) == 6
    # Without max_tokens the response_length budget applies.
    default = await server.generate(prompt_ids=prompt, sampling_params={"temperature": 0}, request_id="b")
    assert 1 <= len(default.token_ids) <= server.config.response_length

    # A closed gate parks requests until resume_generation; reject_request fails them at once.
    await server.abort_all_requests()
    parked = asyncio.create_task(server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="c"))
    await asyncio.sleep(0.2)
    assert not parked.done()
    await server.resume_generation()
    assert (await parked).token_ids == first.token_ids
    await server.abort_all_requests(reject_request=True)
    rejected = await server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="d")
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []
    await server.resume_generation()

    # Weight updates land in the model and the reported weight version follows set_global_steps.
    state = server.get_state_dict()
    await server.update_weights([(k, v * 0.5) for k, v in state.items()])
    await server.set_global_steps(7)
    torch.testing.assert_close(server.get_state_dict()["model.norm.weight"], state["model.norm.weight"] * 0.5)
    after = await server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="e")
    assert after.extra_fields["global_steps"] == 7
    assert after.log_probs != first.log_probs


def test_a_replica_never_falls_back_to_the_cpu_on_an_accelerator_platform(monkeypatch):
    from verl.plugin import platform

    from agentrl_verl.backends.hf_rollout.server import resolve_device

    assert resolve_device("1").type == "cpu"  # verl's cpu platform (this machine): the CPU by design
    monkeypatch.setattr(platform, "get_platform", lambda: object())  # an accelerator platform
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match=r"(?s)GPU 1, but torch sees no CUDA device.*ray_init.num_gpus"):
        resolve_device("1")


def test_ray_gpus_beyond_the_cards_are_shares_of_them_only_when_the_setting_says_so(monkeypatch):
    from verl.plugin import platform

    from agentrl_verl.backends.hf_rollout.server import card_of, resolve_device

    assert [card_of(i, None) for i in ("0", "1", "5")] == ["0", "1", "5"]
    assert [card_of(i, 1) for i in ("0", "1", "2")] == ["0", "0", "0"]  # one card: every replica on it
    assert [card_of(i, 8) for i in ("3", "8", "13")] == ["3", "0", "5"]
    for bad in (0, -1, "1", True, 1.5):
        with pytest.raises(ValueError, match=r"engine_kwargs\.hf\.physical_gpus"):
            card_of("0", bad)
    with pytest.raises(ValueError, match="'GPU-1f2e'"):
        card_of("GPU-1f2e", 1)
    monkeypatch.setattr(platform, "get_platform", lambda: object())  # an accelerator platform
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    # The cross-policy pool's stale replica, Ray's second logical GPU of a one-card node, serves on that card.
    assert resolve_device("1", 1) == torch.device("cuda:0")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert resolve_device("1") == torch.device("cuda:0") and os.environ["CUDA_VISIBLE_DEVICES"] == "1"


def test_a_misspelt_hf_setting_is_named_not_ignored():
    from types import SimpleNamespace

    from agentrl_verl.backends.hf_rollout.adapter import hf_engine_kwargs

    assert hf_engine_kwargs(SimpleNamespace(engine_kwargs=None)) == {}
    given = {"physical_gpus": 1, "weight_transport": "shm"}
    assert hf_engine_kwargs(SimpleNamespace(engine_kwargs={"hf": given, "vllm": {"x": 1}})) == given
    with pytest.raises(ValueError, match=r"engine_kwargs\.hf\.physical_gpu: the hf backend reads .*physical_gpus"):
        hf_engine_kwargs(SimpleNamespace(engine_kwargs={"hf": {"physical_gpu": 1}}))


async def _send_bucketed(handle: str, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
    # verl's sender blocks on its socket: in a thread of its own, as it is in another process in a run.
    sender = bucketed_sender(handle, bucket_mb=2, use_shm=True)
    await asyncio.to_thread(lambda: asyncio.run(sender.async_send_weights(iter(named_tensors))))


async def test_weights_arrive_bucket_by_bucket_through_verls_transfer_in_shared_memory(server):
    state = server.get_state_dict()
    assert sum(t.nbytes for t in state.values()) > 2 << 20  # more than one 2 MB bucket
    handle = f"ipc:///tmp/agentrl-test-{uuid.uuid4().hex}.sock"
    count, _ = await asyncio.wait_for(asyncio.gather(
        server.receive_weights(handle, use_shm=True), _send_bucketed(handle, [(k, v * 0.25) for k, v in state.items()])
    ), timeout=60)
    assert count == len(state)
    after = server.get_state_dict()
    for name, tensor in state.items():
        torch.testing.assert_close(after[name], tensor * 0.25)

    # A tensor the model lacks: the sender still finishes, and the server names the tensor.
    handle = f"ipc:///tmp/agentrl-test-{uuid.uuid4().hex}.sock"
    received = asyncio.create_task(server.receive_weights(handle, use_shm=True))
    await asyncio.wait_for(_send_bucketed(handle, [("not.a.weight", torch.zeros(3))]), timeout=60)
    with pytest.raises(KeyError, match="not.a.weight"):
        await received


def _adapter(weight_transport: str = "auto", sync_weights: bool = True) -> HFServerAdapter:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="cpu_tiny", overrides=[
            f"actor_rollout_ref.model.path={build_tiny_model()}",
            f"+actor_rollout_ref.rollout.engine_kwargs.hf.weight_transport={weight_transport}",
            f"actor_rollout_ref.rollout.engine_kwargs.hf.sync_weights={str(sync_weights).lower()}"])
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model, dataclass_type=HFModelConfig)
    return HFServerAdapter(rollout, model, None)


def test_an_unknown_weight_transport_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match=r"engine_kwargs\.hf\.weight_transport='nccl': use one of auto, cuda_ipc"):
        _adapter("nccl")


def test_weights_in_host_memory_take_the_object_store_and_are_refused_cuda_ipc():
    assert _adapter("auto")._transport(torch.zeros(2)) == "object_store"
    assert _adapter("shm")._transport(torch.zeros(2)) == "shm"
    with pytest.raises(ValueError, match=r"weight_transport=cuda_ipc, but the weights to send are on cpu"):
        _adapter("cuda_ipc")._transport(torch.zeros(2))


class _ServerReached(Exception):
    pass


def _unreachable_server():
    raise _ServerReached


async def test_a_rollout_without_weight_sync_keeps_its_weights_yet_drains_the_trainers_stream(monkeypatch):
    produced = []

    def weights():  # each tensor is collective across the trainer's ranks: every one must be taken
        for name in ("a", "b", "c"):
            produced.append(name)
            yield name, torch.zeros(2)

    frozen = _adapter(sync_weights=False)
    monkeypatch.setattr(frozen, "_server", _unreachable_server)
    await frozen.update_weights(weights(), global_steps=1)  # no call reaches the server
    assert produced == ["a", "b", "c"]

    synced = _adapter()
    monkeypatch.setattr(synced, "_server", _unreachable_server)
    with pytest.raises(_ServerReached):
        await synced.update_weights(weights(), global_steps=1)
