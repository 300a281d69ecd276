"""Throughput of the ``hf`` rollout engine versus plain ``model.generate`` on the same batch.

For each concurrency c, c requests of the same prompt length are sent to :class:`HFGenerationEngine` at once
(continuous batching, per-request KV caches), and the same c prompts go to ``model.generate`` as one batch.
Both decode greedily for a fixed number of new tokens (eos ignored), so they do the same work.

    python -m bench.hf_rollout                       # tiny model on CPU
    python -m bench.hf_rollout --model qwen2-0.5b    # random Qwen2 of Qwen2.5-0.5B's shape (GPU), bf16
    python -m bench.hf_rollout --model smollm2-135m --concurrency 1 8 32 64 128   # SmolLM2-135M's shape

Last line: ``key=value`` pairs (tokens/s per concurrency for both, and their ratio).

Results and how to read them: ``docs/training/rollout-backends.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import torch

from agentrl_verl.backends.hf_rollout.engine import HFGenerationEngine
from agentrl_verl.backends.hf_rollout.sampling import SamplingParams

logger = logging.getLogger("bench.hf_rollout")

# Architectures of real models, with random weights (no model hub here; throughput does not depend on the weights).
SHAPES = {
    "qwen2-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                 tie_word_embeddings=True)),
    # SmolLM2-135M-Instruct (`agentrl-verl build-model smollm2`): llama, 30 thin layers, a 49,152-token vocabulary.
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                   max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True)),
}


def build_model(name: str, device: torch.device, dtype: torch.dtype):
    """The bench's model: ``tiny`` (the demo's, trained weights) or one of :data:`SHAPES` with random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if name == "tiny":
        from agentrl_verl.models.tiny import build_tiny_model

        model = AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=dtype, attn_implementation="sdpa")
    elif name in SHAPES:
        model_type, shape = SHAPES[name]
        torch.manual_seed(0)
        config = AutoConfig.for_model(model_type, **shape, attn_implementation="sdpa")
        with device:  # random init on the GPU: seconds instead of half a minute on the host
            model = AutoModelForCausalLM.from_config(config).to(dtype)
    else:
        raise ValueError(f"unknown model {name!r}: use tiny or one of {', '.join(SHAPES)}")
    return model.to(device).eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


async def engine_tokens_per_s(engine: HFGenerationEngine, prompts: list[list[int]], new_tokens: int) -> float:
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True, logprobs=True)
    await engine.clear_cache()  # each round measures full prefills
    start = time.perf_counter()
    outs = await asyncio.gather(*[engine.generate(f"r{i}", p, params) for i, p in enumerate(prompts)])
    sync(engine.device)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == new_tokens for o in outs)
    return len(prompts) * new_tokens / elapsed


@torch.inference_mode()
def generate_tokens_per_s(model, prompts: list[list[int]], new_tokens: int, device: torch.device) -> float:
    batch = torch.tensor(prompts, device=device)
    start = time.perf_counter()
    out = model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    sync(device)
    elapsed = time.perf_counter() - start
    assert out.shape[1] - batch.shape[1] == new_tokens
    return len(prompts) * new_tokens / elapsed


async def main(args: argparse.Namespace) -> dict[str, str]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype or
                                                                   ("bfloat16" if device.type == "cuda" else "float32")]
    model = build_model(args.model, device, dtype)
    engine = HFGenerationEngine(model, eos_token_ids=[], max_batch_size=max(args.concurrency))
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "model": args.model, "dtype": str(dtype).removeprefix("torch."),
               "params_m": f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}",
               "prompt_len": str(args.prompt_len), "new_tokens": str(args.new_tokens)}
    for c in args.concurrency:
        prompts = torch.randint(100, vocab, (c, args.prompt_len), generator=gen).tolist()
        # Warm-up (kernels, allocator) once per shape, then the best of --repeats, the two taking turns: a change
        # of the machine's speed during the run (clocks, other tenants) then hits both alike.
        await engine_tokens_per_s(engine, prompts, 4)
        generate_tokens_per_s(model, prompts, 4, device)
        ours, base = 0.0, 0.0
        for _ in range(args.repeats):
            ours = max(ours, await engine_tokens_per_s(engine, prompts, args.new_tokens))
            base = max(base, generate_tokens_per_s(model, prompts, args.new_tokens, device))
        results[f"hf_tok_s_c{c}"] = f"{ours:.1f}"
        results[f"generate_tok_s_c{c}"] = f"{base:.1f}"
        results[f"ratio_c{c}"] = f"{ours / base:.2f}"
        logger.info("c=%d: hf %.1f tok/s, model.generate %.1f tok/s, ratio %.2f", c, ours, base, ours / base)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help=f"tiny | {' | '.join(SHAPES)}")
    parser.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)  # verl set up the root logger
    summary = asyncio.run(main(parser.parse_args()))
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
