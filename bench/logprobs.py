"""verl's token log-probabilities without flash-attn, row by row (verl's ``logprobs_from_logits_v2``) against
chunks of rows (:mod:`agentrl_verl.backends.chunked_logprobs`), forward and backward, in the same run.

The logits are the actor's as verl's FSDP engine hands them over, padding removed: ``(tokens, vocab)``. The default
cases are the demo's batch (about 9,000 tokens, the tiny tokenizer's 2,048-token vocabulary) and a Qwen2.5 vocabulary
(151,936) at 2,048 tokens; each is timed ``--repeats`` times, the two alternating.

    python -m bench.logprobs --device cuda          # or cpu

Last line: ``key=value`` pairs (median seconds for each case and function, and their ratio).

Results: ``docs/gpu.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from agentrl_verl.backends.chunked_logprobs import VERL_LOGPROBS, chunked_logprobs

CASES = {"demo": (9100, 2048), "qwen_vocab": (2048, 151936)}
"""Case name -> (tokens, vocabulary)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn, logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Seconds for one forward and backward of ``fn`` (the gradient of the log-probs' sum)."""
    _sync(logits.device)
    start = time.perf_counter()
    out = fn(logits, labels)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    _sync(logits.device)
    del grad
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    pairs = {}
    for case in args.cases:
        tokens, vocab = CASES[case]
        generator = torch.Generator().manual_seed(0)
        logits = torch.randn(tokens, vocab, generator=generator).to(device, dtype).requires_grad_()
        labels = torch.randint(0, vocab, (tokens,), generator=generator).to(device)
        times = {"verl": [], "chunked": []}
        for repeat in range(args.repeats + 1):  # the first round warms up kernels and allocator
            for name, fn in (("verl", VERL_LOGPROBS), ("chunked", chunked_logprobs)):
                seconds = time_once(fn, logits, labels)
                if repeat:
                    times[name].append(seconds)
        verl, chunked = statistics.median(times["verl"]), statistics.median(times["chunked"])
        print(f"{case}: {tokens} tokens x {vocab} vocabulary, {args.dtype} on {device}: verl row by row {verl:.4f} s, "
              f"chunked {chunked:.4f} s, {verl / chunked:.1f}x", flush=True)
        pairs.update({f"{case}_verl_s": f"{verl:.4f}", f"{case}_chunked_s": f"{chunked:.4f}",
                      f"{case}_ratio": f"{verl / chunked:.1f}"})
    print(" ".join(f"{k}={v}" for k, v in pairs.items()))


if __name__ == "__main__":
    main()
