"""Throughput of verl's vLLM engine versus the ``hf`` rollout engine on the same batch (run from ``.venv-vllm``).

For each concurrency c, the same c prompts go to vLLM (``LLM.generate``, token ids in, eager mode, a KV cache of
12% of host memory) and to :class:`HFGenerationEngine` (c concurrent requests, as
:mod:`bench.hf_rollout` does). Both decode greedily for a fixed number of new tokens (eos ignored).

    .venv-vllm/bin/python -m bench.vllm_rollout                      # tiny model on CPU
    .venv-vllm/bin/python -m bench.vllm_rollout --model qwen2-0.5b   # random Qwen2 of Qwen2.5-0.5B's shape

Last line: ``key=value`` pairs (tokens/s per concurrency for both, and their ratio).

Results and how to read them: ``docs/training/rollout-backends.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time

import torch

from bench.hf_rollout import build_model, engine_tokens_per_s

logger = logging.getLogger("bench.vllm_rollout")

# The share of host memory vLLM reserves for its KV cache on CPU (one engine here; the cpu_vllm preset gives each
# replica a fixed size instead).
GPU_MEMORY_UTILIZATION = 0.12


def vllm_tokens_per_s(llm, prompts: list[list[int]], new_tokens: int) -> float:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True, logprobs=0)
    llm.reset_prefix_cache()  # each round measures full prefills
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == new_tokens for o in outs)
    return len(prompts) * new_tokens / elapsed


def main(args: argparse.Namespace) -> dict[str, str]:
    from vllm import LLM

    from agentrl_verl.backends.hf_rollout.engine import HFGenerationEngine

    device, dtype = torch.device("cpu"), torch.float32
    model = build_model(args.model, device, dtype)
    engine = HFGenerationEngine(model, eos_token_ids=[], max_batch_size=max(args.concurrency))
    with tempfile.TemporaryDirectory() as model_dir:
        model.save_pretrained(model_dir)
        llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                  gpu_memory_utilization=GPU_MEMORY_UTILIZATION, max_model_len=args.prompt_len + args.new_tokens,
                  seed=0)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    results = {"device": "cpu", "model": args.model, "dtype": "float32",
               "params_m": f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}",
               "prompt_len": str(args.prompt_len), "new_tokens": str(args.new_tokens)}
    for c in args.concurrency:
        prompts = torch.randint(100, vocab, (c, args.prompt_len), generator=gen).tolist()
        # Warm-up once per shape, then the best of --repeats.
        vllm_tokens_per_s(llm, prompts, 4)
        asyncio.run(engine_tokens_per_s(engine, prompts, 4))
        vllm = max(vllm_tokens_per_s(llm, prompts, args.new_tokens) for _ in range(args.repeats))
        hf = max(asyncio.run(engine_tokens_per_s(engine, prompts, args.new_tokens)) for _ in range(args.repeats))
        results[f"vllm_tok_s_c{c}"] = f"{vllm:.1f}"
        results[f"hf_tok_s_c{c}"] = f"{hf:.1f}"
        results[f"ratio_c{c}"] = f"{vllm / hf:.2f}"
        logger.info("c=%d: vllm %.1f tok/s, hf %.1f tok/s, ratio %.2f", c, vllm, hf, vllm / hf)
    return results


if __name__ == "__main__":  # vLLM starts its workers with spawn: they re-import this module
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny | qwen2-0.5b")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    summary = main(parser.parse_args())
    print(" ".join(f"{k}={v}" for k, v in summary.items()))
