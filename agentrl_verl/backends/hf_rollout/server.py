"""The ``hf`` rollout server: a Ray actor around :class:`HFGenerationEngine` with the method set verl calls.

verl's ``LLMServerClient`` calls ``generate`` (token ids in, token ids + log-probs out); the replica and the
checkpoint engine call ``wake_up`` / ``sleep``, ``abort_all_requests`` / ``resume_generation``,
``clear_kv_cache``, ``release_kv_cache`` / ``resume_kv_cache``, ``set_global_steps`` and the profiler hooks, as
on verl's vLLM server. Weights arrive through ``update_weights`` from :class:`HFServerAdapter`.

The server runs on the device of the trainer worker it belongs to: the replica passes that worker's visible
device, and the actor uses ``cuda:0`` of it (the CPU on verl's ``cpu`` platform). Where Ray counts more GPUs than a
node has cards (``engine_kwargs.hf.physical_gpus``), Ray's GPU ids are shares of the cards (:func:`card_of`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import ray
import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.device import set_expandable_segments
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.replica import RolloutMode, TokenOutput

from agentrl_verl.backends.hf_rollout.adapter import ROLLOUT_ENGINE_KEY, hf_engine_kwargs
from agentrl_verl.backends.hf_rollout.engine import HFGenerationEngine
from agentrl_verl.backends.hf_rollout.sampling import SamplingParams
from agentrl_verl.core.verl_seam import bucketed_weight_transfer

logger = logging.getLogger(__name__)

# verl's rollout ``dtype`` strings and their torch types.
_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
           "float32": torch.float32, "fp32": torch.float32}


PHYSICAL_GPUS_SETTING = f"actor_rollout_ref.rollout.engine_kwargs.{ROLLOUT_ENGINE_KEY}.physical_gpus"


def card_of(ray_gpu_id: str, physical_gpus: int | None) -> str:
    """The card (as ``CUDA_VISIBLE_DEVICES`` names it) of a server that Ray placed on GPU ``ray_gpu_id``.

    Without ``physical_gpus`` Ray's id is the card. With it, Ray's GPUs are logical shares of a node's
    ``physical_gpus`` cards (``ray_kwargs.ray_init.num_gpus`` larger than the card count, as on one card with the
    cross-policy pool's stale replica): id ``i`` serves on card ``i mod physical_gpus``.

    Raises:
        ValueError: ``physical_gpus`` is not a positive integer, or Ray's id is not a card index.
    """
    if physical_gpus is None:
        return ray_gpu_id
    if isinstance(physical_gpus, bool) or not isinstance(physical_gpus, int) or physical_gpus < 1:
        raise ValueError(f"{PHYSICAL_GPUS_SETTING}={physical_gpus!r}: give the number of cards per node (e.g. 1)")
    if not ray_gpu_id.isdigit():
        raise ValueError(f"{PHYSICAL_GPUS_SETTING} maps Ray's GPU ids onto cards, but Ray gave {ray_gpu_id!r}")
    return str(int(ray_gpu_id) % physical_gpus)


def resolve_device(visible_devices: str | None, physical_gpus: int | None = None) -> torch.device:
    """The device this server should use: the CPU on verl's ``cpu`` platform, else its card (:func:`card_of`).

    Raises:
        RuntimeError: on an accelerator platform, torch sees no CUDA device where Ray placed the replica (never a
            silent fall back to the CPU: a replica there would run a quarter of the turns many times slower).
    """
    from verl.plugin import platform

    from agentrl_verl.backends.platform_cpu import PlatformCPU

    if isinstance(platform.get_platform(), PlatformCPU):
        return torch.device("cpu")
    if visible_devices:
        card = card_of(visible_devices, physical_gpus)
        if card != visible_devices:
            print(f"hf rollout server: Ray's GPU {visible_devices} is a share of card {card} "
                  f"({PHYSICAL_GPUS_SETTING}={physical_gpus})", flush=True)
        os.environ["CUDA_VISIBLE_DEVICES"] = card
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"hf rollout server: Ray placed this replica on GPU {visible_devices or '(none given)'}, but torch sees "
            f"no CUDA device there (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}). The run asks "
            "for more GPUs than the machine has: make ray_kwargs.ray_init.num_gpus the real count and the replicas "
            f"fit it (the cross-policy pool's stale_replicas take one each), set {PHYSICAL_GPUS_SETTING} to the "
            "node's card count to share the cards, or run on the CPU with AGENTRL_PLATFORM=cpu")
    return torch.device("cuda:0")


class HFRolloutServer:
    """Token-in/token-out generation server for one rollout replica.

    Args:
        config: The rollout config (``actor_rollout_ref.rollout``), dataclass or DictConfig.
        model_config: The model config (``actor_rollout_ref.model``), dataclass or DictConfig.
        rollout_mode: How the replica shares devices with the trainer (hybrid, colocated, standalone).
        replica_rank: Rank of the replica this server serves.
        visible_devices: The trainer worker's visible device (e.g. ``"3"``); the server takes that GPU (or the card
            it is a share of, with ``engine_kwargs.hf.physical_gpus``).
        server_name: The Ray actor name, used as the server's address in verl's load balancer.
    """

    def __init__(
        self,
        config: Any,
        model_config: Any,
        rollout_mode: RolloutMode,
        replica_rank: int,
        visible_devices: str | None = None,
        server_name: str = "",
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # The replica hands over raw DictConfigs; convert them as verl's vLLM server does.
        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.rollout_mode = rollout_mode
        self.replica_rank = replica_rank
        self.server_name = server_name
        # Weight version reported with every generation; the weights loaded from the model path are version 0.
        self.global_steps = 0
        self.device = resolve_device(visible_devices, hf_engine_kwargs(self.config).get("physical_gpus"))
        dtype = _DTYPES.get(str(self.config.dtype))
        if dtype is None:
            raise ValueError(f"rollout.dtype={self.config.dtype!r} is not one of {sorted(_DTYPES)}")
        if self.device.type == "cpu" and dtype != torch.float32:
            logger.info("hf rollout: %s on CPU is slow and inexact; using float32", self.config.dtype)
            dtype = torch.float32
        if self.device.type == "cuda":
            # As verl's vLLM server without sleep mode: the KV caches of a continuous batch change size every few
            # steps, and on a card shared with the trainer fixed-size segments leave memory stranded in gaps.
            set_expandable_segments(True)
        path = self.model_config.local_path
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation="sdpa", trust_remote_code=self.model_config.trust_remote_code
        ).to(self.device)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=self.model_config.trust_remote_code)
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.max_model_len = self.config.max_model_len or self.config.prompt_length + self.config.response_length
        self.engine = HFGenerationEngine(
            model,
            eos_token_ids=eos_ids,
            tokenizer=tokenizer,
            max_batch_size=self.config.max_num_seqs,
            prefix_cache_entries=self.config.max_num_seqs if self.config.enable_prefix_caching else 0,
            seed=self.config.seed + replica_rank if self.config.full_determinism else None,
        )
        # Admission gate, closed by abort_all_requests until resume_generation (weight sync in between).
        self._gate_open = asyncio.Event()
        self._gate_open.set()
        self._rejecting = False
        self._offloaded = False
        # Printed, not logged: Ray passes an actor's stdout to the driver's log, where this line is the record of the
        # device each replica serves on (loggers in Ray actors stay at WARNING).
        print(f"hf rollout server {server_name}: {path} on {self.device} ({dtype})", flush=True)

    # ------------------------------------------------------------------------------------------------------------
    # Generation
    # ------------------------------------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Generate a continuation of ``prompt_ids`` (verl's token-in/token-out server call)."""
        if image_data is not None or video_data is not None or audio_data is not None:
            raise NotImplementedError("the hf rollout backend serves text-only models")
        prompt_ids = [int(t) for t in prompt_ids]
        default_max = min(self.config.response_length, self.max_model_len - len(prompt_ids))
        params = SamplingParams.from_request(sampling_params, default_max, self.max_model_len - len(prompt_ids))
        while not self._gate_open.is_set():
            if self._rejecting:
                return self._aborted()
            await self._gate_open.wait()
        out = await self.engine.generate(request_id, prompt_ids, params)
        stop_reason = "aborted" if out.finish_reason == "abort" else "completed"
        return TokenOutput(
            token_ids=out.token_ids,
            log_probs=out.log_probs,
            stop_reason=stop_reason,
            extra_fields={"global_steps": self.global_steps, "num_cached_tokens": out.num_cached_tokens},
        )

    def _aborted(self) -> TokenOutput:
        return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted",
                           extra_fields={"global_steps": self.global_steps})

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        """Close the admission gate and abort what runs; partial outputs return with ``stop_reason="aborted"``."""
        self._gate_open.clear()
        self._rejecting = reject_request
        request_ids = await self.engine.abort_all()
        if reset_prefix_cache:
            await self.engine.clear_cache()
        return {"aborted_count": len(request_ids), "request_ids": request_ids}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        aborted = await self.engine.abort(request_id)
        return {"aborted": aborted, "request_id": request_id}

    async def resume_generation(self) -> None:
        """Reopen the admission gate after :meth:`abort_all_requests`."""
        self._rejecting = False
        self._gate_open.set()

    async def pause_generation(self) -> None:
        """Close the admission gate without aborting; return once running requests have finished.

        Added for the ``agentrl_async`` trainer: new requests wait at the gate until :meth:`resume_generation`, so
        a weight update made in between lands between turns and every generation runs on one weight version.
        """
        self._rejecting = False
        self._gate_open.clear()
        await self.wait_for_requests_to_drain()

    async def wait_for_requests_to_drain(self) -> None:
        while self.engine.num_running or self.engine.num_waiting:
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------------------------------------------------
    # Memory and weights
    # ------------------------------------------------------------------------------------------------------------

    async def sleep(self) -> None:
        """Hybrid mode on a GPU: move the model to host memory while the trainer uses the device."""
        if self.config.free_cache_engine and self.rollout_mode == RolloutMode.HYBRID and self.device.type != "cpu":
            await self.engine.to("cpu")
            torch.cuda.empty_cache()
            self._offloaded = True

    async def wake_up(self, tags: list[str] | None = None) -> None:
        if self._offloaded and (tags is None or "weights" in tags):
            await self.engine.to(self.device)
            self._offloaded = False

    async def clear_kv_cache(self) -> None:
        await self.engine.clear_cache()

    async def release_kv_cache(self) -> None:
        await self.engine.clear_cache()

    async def resume_kv_cache(self) -> None:
        return None

    async def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Load a bucket of named tensors (HF parameter names) into the model."""
        return await self.engine.load_weights(named_tensors)

    async def receive_weights(self, zmq_handle: str, use_shm: bool = False) -> int:
        """Take a weight update from the adapter's verl ``BucketedWeightSender`` at ``zmq_handle`` (CUDA IPC, or
        shared memory with ``use_shm``), loading each bucket as it arrives; returns how many tensors were loaded."""
        receiver = bucketed_weight_transfer().BucketedWeightReceiver(
            zmq_handle=zmq_handle, device=self.device, use_shm=use_shm)
        return await self.engine.load_weight_stream(receiver.receive_weights)

    async def set_global_steps(self, global_steps: int) -> None:
        """Record the trainer step whose weights the server now holds (returned with every generation)."""
        self.global_steps = global_steps

    # ------------------------------------------------------------------------------------------------------------
    # Introspection and profiler hooks
    # ------------------------------------------------------------------------------------------------------------

    def get_server_address(self) -> tuple[str, str]:
        return ray.util.get_node_ip_address(), self.server_name

    def get_rollout_config(self) -> RolloutConfig:
        return self.config

    def get_device(self) -> str:
        return str(self.device)

    def get_state_dict(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the current weights (for tests and checks of weight sync)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.engine.model.state_dict().items()}

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None
