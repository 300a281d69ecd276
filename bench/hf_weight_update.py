"""One ``hf`` weight update, old path against new, in the same run: the trainer's full tensors reach the rollout
server as host copies through Ray's object store (``object_store``, the path before) or by CUDA IPC through verl's
bucketed transfer (``cuda_ipc``).

The trainer side is this process, holding a random Qwen2 of the given shape on the GPU; the server is the real
:class:`HFRolloutServer` as a Ray actor on the same GPU, and the update goes through the real
:class:`HFServerAdapter`, as in a run. The two transports alternate, ``--repeats`` times each; after the last update
the server's weights are compared with the trainer's.

    python -m bench.hf_weight_update --shape qwen2-1.5b     # needs a GPU

Last line: ``key=value`` pairs (median seconds per update for each transport, and their ratio).

Results: ``docs/training/rollout-backends.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agentrl_verl.backends.hf_rollout.adapter import HFServerAdapter, server_actor_name

# Qwen2.5 architectures with the tiny tokenizer's vocabulary (random weights: no model hub here).
SHAPES = {
    "qwen2-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, tie_word_embeddings=True),
}


def build_model_dir(shape: str, tokenizer_dir: Path, target: Path) -> Path:
    """A random Qwen2 of ``shape`` with the vocabulary and tokenizer files of the model at ``tokenizer_dir``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, max_position_embeddings=4096, **SHAPES[shape])
    with torch.device("cuda"):  # random init on the GPU: seconds instead of minutes on the host
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(target)
    for item in tokenizer_dir.iterdir():
        if item.name.startswith("tokenizer") or item.name in ("special_tokens_map.json", "chat_template.jinja",
                                                              "generation_config.json"):
            shutil.copy(item, target / item.name)
    return target


def main(args: argparse.Namespace) -> dict[str, str]:
    import ray
    from hydra import compose, initialize_config_dir
    from transformers import Qwen2ForCausalLM
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig
    from verl.workers.rollout.replica import RolloutMode

    from agentrl_verl.backends.hf_rollout.server import HFRolloutServer
    from agentrl_verl.models.tiny import build_tiny_model
    from agentrl_verl.presets import CONFIG_DIR

    if not torch.cuda.is_available():
        raise SystemExit("bench.hf_weight_update needs a CUDA GPU (CUDA IPC is the path it measures)")
    tokenizer_dir = Path(args.tokenizer) if args.tokenizer else build_tiny_model()
    workdir = Path(tempfile.mkdtemp(prefix="hf-weight-update-"))
    path = build_model_dir(args.shape, tokenizer_dir, workdir / args.shape)
    trainer = Qwen2ForCausalLM.from_pretrained(path, dtype=getattr(torch, args.trainer_dtype)).cuda()
    numel = sum(p.numel() for p in trainer.parameters())
    print(f"{args.shape}: {numel / 1e9:.2f} B parameters, trainer weights in {args.trainer_dtype}, server in bfloat16, "
          f"{args.bucket_mb} MB buckets", flush=True)

    configs = {}
    for transport in ("object_store", "cuda_ipc"):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            cfg = compose(config_name="cpu_tiny", overrides=[
                f"actor_rollout_ref.model.path={path}", "actor_rollout_ref.rollout.dtype=bfloat16",
                f"actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes={args.bucket_mb}",
                f"+actor_rollout_ref.rollout.engine_kwargs.hf.weight_transport={transport}"])
        configs[transport] = cfg
    ray.init(num_gpus=1, include_dashboard=False)
    gpu = ray.get(ray.remote(num_gpus=1)(lambda: ray.get_runtime_context().get_accelerator_ids()["GPU"][0]).remote())
    cfg = configs["cuda_ipc"]
    server = ray.remote(HFRolloutServer).options(
        name=server_actor_name(0), runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    ).remote(cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model, RolloutMode.HYBRID, 0,
             visible_devices=str(gpu))
    print("server device", ray.get(server.get_device.remote()), flush=True)
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model, dataclass_type=HFModelConfig)
    adapters = {name: HFServerAdapter(omega_conf_to_dataclass(c.actor_rollout_ref.rollout), model_config, None,
                                      replica_rank=0) for name, c in configs.items()}

    times: dict[str, list[float]] = {name: [] for name in adapters}
    for step in range(args.repeats):
        for name, adapter in adapters.items():
            with torch.no_grad():
                for p in trainer.parameters():
                    p.add_(1e-3)  # new weights every update, as after an optimizer step
            torch.cuda.synchronize()
            started = time.perf_counter()
            asyncio.run(adapter.update_weights(iter(trainer.state_dict().items()), global_steps=step))
            times[name].append(time.perf_counter() - started)
            print(f"update {step} by {name}: {times[name][-1]:.2f} s", flush=True)

    served = ray.get(server.get_state_dict.remote())
    worst = max((served[k].float().cpu() - v.to(torch.bfloat16).float().cpu()).abs().max().item()
                for k, v in trainer.state_dict().items() if k in served)
    print(f"largest difference between the server's and the trainer's weights after the last update: {worst:g}")
    ray.shutdown()
    shutil.rmtree(workdir, ignore_errors=True)
    old, new = statistics.median(times["object_store"]), statistics.median(times["cuda_ipc"])
    return {"shape": args.shape, "object_store_s": f"{old:.2f}", "cuda_ipc_s": f"{new:.2f}",
            "speedup": f"{old / new:.1f}", "max_abs_diff": f"{worst:g}"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", help="a model folder whose tokenizer to use (default: the tiny model's)")
    parser.add_argument("--trainer-dtype", default="float32", choices=["float32", "bfloat16"],
                        help="dtype of the trainer's weights (FSDP's full tensors are float32)")
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    result = main(parser.parse_args())
    print(" ".join(f"{k}={v}" for k, v in result.items()))
