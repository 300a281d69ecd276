"""Sampling parameters of one request and batched token sampling (pure torch).

The request keys follow vLLM's ``SamplingParams`` as verl's agent loops send them (``temperature``, ``top_p``,
``top_k``, ``max_tokens`` or ``max_new_tokens``, ``stop``, ``stop_token_ids``, ``ignore_eos``, ``logprobs``,
``repetition_penalty``). Log-probs are vLLM's ``processed_logprobs`` (verl's default ``logprobs_mode``): the
log-softmax of the temperature-scaled logits, before top-k/top-p, which is what verl's actor recomputes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# Keys verl sends that change nothing here at their neutral value.
_NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0, "n": 1}
_IGNORED = {"seed", "detokenize", "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output"}


@dataclass(frozen=True)
class SamplingParams:
    """How to continue one prompt.

    Attributes:
        max_tokens: Most new tokens to generate (>= 1).
        temperature: 0 means greedy.
        top_p: Nucleus mass in (0, 1].
        top_k: Keep the k most likely tokens; -1 or 0 keeps all.
        stop: Strings that end generation once the decoded output contains one (the stop token is kept).
        stop_token_ids: Token ids that end generation (kept in the output).
        ignore_eos: Do not stop at the model's end-of-sequence tokens.
        logprobs: Return the log-prob of each generated token.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = field(default=())
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False
    logprobs: bool = False

    @classmethod
    def from_request(cls, params: dict[str, Any], default_max_tokens: int, max_possible_tokens: int) -> SamplingParams:
        """Build from a vLLM-style request dict.

        Args:
            params: The request's ``sampling_params``.
            default_max_tokens: Used when neither ``max_tokens`` nor ``max_new_tokens`` is given.
            max_possible_tokens: Room left in the context; ``max_tokens`` is clamped to it.

        Raises:
            ValueError: On keys this backend does not implement at a non-neutral value, or on bad values.
        """
        params = dict(params)
        max_tokens = params.pop("max_tokens", None)
        max_new_tokens = params.pop("max_new_tokens", None)
        limit = max_tokens if max_tokens is not None else max_new_tokens
        limit = default_max_tokens if limit is None else int(limit)
        if max_possible_tokens < 1:
            raise ValueError(f"prompt leaves no room to generate (max_possible_tokens={max_possible_tokens})")
        limit = max(1, min(limit, max_possible_tokens))
        for key, neutral in _NEUTRAL.items():
            value = params.pop(key, neutral)
            if value is not None and float(value) != float(neutral):
                raise ValueError(f"sampling param {key}={value!r} is not supported by the hf rollout backend")
        for key in _IGNORED:
            params.pop(key, None)
        stop = params.pop("stop", None) or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        out = cls(
            max_tokens=limit,
            temperature=float(params.pop("temperature", 1.0)),
            top_p=float(params.pop("top_p", 1.0)),
            top_k=int(params.pop("top_k", -1)),
            stop=stop,
            stop_token_ids=tuple(int(t) for t in params.pop("stop_token_ids", None) or ()),
            ignore_eos=bool(params.pop("ignore_eos", False)),
            logprobs=bool(params.pop("logprobs", False)),
        )
        if params:
            raise ValueError(f"unknown sampling params for the hf rollout backend: {sorted(params)}")
        if out.temperature < 0 or not 0 < out.top_p <= 1:
            raise ValueError(f"bad sampling params: temperature={out.temperature}, top_p={out.top_p}")
        return out


def sample_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row with per-row parameters.

    Args:
        logits: ``[batch, vocab]`` next-token logits.
        params: One :class:`SamplingParams` per row.
        generator: Optional RNG for reproducible sampling.

    Returns:
        ``(tokens, logprobs)``, both ``[batch]``: the chosen ids and their processed log-probs.
    """
    logits = logits.float()
    if all(p.temperature == 0 for p in params):  # decided on the host: a device sync per step costs on a GPU
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logprobs.argmax(dim=-1)
        return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    temperature = torch.tensor([p.temperature for p in params], device=logits.device)
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, 1.0, temperature).unsqueeze(-1)
    logprobs = torch.log_softmax(scaled, dim=-1)
    probs = torch.softmax(_top_k_top_p(scaled, params), dim=-1)
    sampled = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    tokens = torch.where(greedy, logprobs.argmax(dim=-1), sampled)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _top_k_top_p(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Mask (to -inf) what falls outside each row's top-k and top-p."""
    vocab = logits.shape[-1]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    if min(top_k) == vocab and min(top_p) >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device).unsqueeze(0)
    drop = rank >= torch.tensor(top_k, device=logits.device).unsqueeze(-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token when the mass before it already reaches top_p (the first token always stays).
    drop |= (probs.cumsum(dim=-1) - probs) >= torch.tensor(top_p, device=logits.device).unsqueeze(-1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
