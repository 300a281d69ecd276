"""Cold start for models that cannot yet call tools: a supervised warm-up on expert demonstrations.

A randomly initialised model never emits a well-formed ``<tool_call>`` block, so RL alone gets no reward
signal. As AgentRL does for such models, a short supervised warm-up on generated demonstrations comes
first. Everything here is plain torch + transformers (the warm-up is an equivalent of verl's SFT trainer,
kept in-process so that it can stop early on held-out success):

1. :func:`~env_adapters.demonstrations.generate_demonstrations` runs a task's real sessions in-process with a
   scripted expert and keeps the episodes it solved.
2. :func:`tokenize_episode` renders an episode with the model's chat template and masks every token
   except the assistant's own (its content, tool calls and closing ``<|im_end|>``).
3. :func:`supervised_warmup` trains on them with AdamW and checks greedy held-out success every few steps
   (through a callback: the demo plays the episodes with the training agent loop,
   :func:`agentrl_verl.tools.evaluate.evaluate_model`), stopping inside a success window so that RL has room left.
   Once success starts to rise it checks after every step, each check first playing a few of the held-out indices
   and the rest only when those come near the stop (the checks, not the training steps, were most of its time).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_adapters.demonstrations import Episode
from env_adapters.protocol import Message, ToolSchema

logger = logging.getLogger(__name__)
_MALLOC_TRIM = getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)
"""glibc's ``malloc_trim`` (:func:`release_device_memory`); None with a C library that has none."""

PROGRESS_EVERY_S = 30.0
"""Seconds between the warm-up's progress lines when no held-out check falls in between."""


# ---- tokenization -------------------------------------------------------------------------------------


def tokenize_episode(tokenizer, messages: list[Message], tools: list[ToolSchema] | None) -> tuple[list[int], list[int]]:
    """Token ids of a rendered conversation and a loss mask that is 1 exactly on the assistant's tokens.

    Each assistant turn contributes what the model generates after ``<|im_start|>assistant\\n``: its
    content, tool calls and the closing ``<|im_end|>`` (the eos the model must learn to stop with). The
    newline after it and everything else (system, user, tool replies, role headers) is context (mask 0).
    The pieces are tokenized separately and concatenated; the result equals the tokenization of the whole
    rendered text (tested), so the warm-up sees the same ids as generation does.
    """
    eos = tokenizer.eos_token
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""

    def add(text: str, trained: int) -> None:
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids.extend(piece)
        mask.extend([trained] * len(piece))

    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render_conversation(tokenizer, messages[:i], tools, add_generation_prompt=True)
        full = render_conversation(tokenizer, messages[: i + 1], tools, add_generation_prompt=False)
        if not (prompt.startswith(rendered) and full.startswith(prompt)):
            raise ValueError(f"the chat template is not append-only at message {i}; cannot mask assistant turns")
        reply = full[len(prompt):]
        end = reply.index(eos) + len(eos)
        add(prompt[len(rendered):], 0)
        add(reply[:end], 1)
        rendered = prompt + reply[:end]
    full = render_conversation(tokenizer, messages, tools, add_generation_prompt=False)
    if len(full) > len(rendered):
        add(full[len(rendered):], 0)
    return ids, mask


def render_conversation(tokenizer, messages: list[Message], tools: list[ToolSchema] | None,
                        add_generation_prompt: bool) -> str:
    """``messages`` (and ``tools``, where any) rendered by the tokenizer's chat template, as text."""
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


# ---- supervised warm-up ------------------------------------------------------------------------------


@dataclass
class WarmupConfig:
    """Supervised warm-up settings (defaults: the recipe measured in docs/tiny-learning.md)."""

    max_steps: int = 400
    batch_size: int = 32
    lr: float = 1e-3
    grad_clip: float = 1.0
    eval_every: int = 10
    stop_success: float = 0.4
    """Stop at the first evaluation whose greedy held-out success reaches this (leaves RL room to show)."""
    dense_eval_from: float = 0.05
    """Once an evaluation reaches this success, evaluate after every step: success jumps from near 0 to 0.8 within
    ten steps on some seeds, and coarser checks overshoot the window."""
    screen_indices: int = 25
    """While evaluating after every step, each check plays only the first this many held-out indices, and the others
    only when these reach ``stop_success - screen_margin``: the stop is still decided on every index, at a quarter of
    the cost for the steps that are clearly short of it (0: every check plays every index)."""
    screen_margin: float = 0.15
    seed: int = 0
    device: str = "auto"
    """Where the warm-up trains: ``cpu``, ``cuda``, or ``auto`` (``cuda`` where torch sees a GPU). Its held-out checks
    play there too, as RL's rollout does on that machine (on a GPU, the CPU's cores are left to verl's start-up
    beside it); the checkpoint is saved from the CPU."""


@dataclass
class WarmupResult:
    """What :func:`supervised_warmup` did: the checkpoint it wrote and its learning history."""

    path: str
    steps: int
    success: float
    device: str
    """Where it trained (``warmup.device`` resolved)."""
    history: list[dict[str, float]] = field(default_factory=list)
    """One row per check: step, mean training loss since the last check, held-out success, the episodes it is over
    (fewer than all for a screened check) and the seconds since the start."""


HeldOutCheck = Callable[[Any, slice], list[bool]]
"""``(model, part) -> greedy success of each episode`` on ``part`` (a slice) of the warm-up's held-out indices."""


def supervised_warmup(model_dir: str | Path, demos: Sequence[Episode], output_dir: str | Path,
                      eval_fn: HeldOutCheck, config: WarmupConfig | None = None) -> WarmupResult:
    """Train on demonstrations (loss on assistant tokens only) until held-out success enters the RL window.

    Args:
        model_dir: HF model directory to start from.
        demos: Solved episodes (see :func:`generate_demonstrations`).
        output_dir: Where the warmed-up model and tokenizer are saved (a normal HF directory).
        eval_fn: Plays held-out episodes greedily (every ``eval_every`` steps, then every step from
            ``dense_eval_from`` on, screened by ``screen_indices``).
        config: Optimisation and stopping settings.

    Returns:
        The checkpoint path, the number of steps, the last held-out success and the history.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = config or WarmupConfig()
    device = device_setting(config.device, "warmup.device")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    data = [tokenize_episode(tokenizer, d.messages, d.tools) for d in demos]
    if not data:
        raise ValueError("no demonstrations to train on; check that the expert solves the task")
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    history: list[dict[str, float]] = []
    order: list[int] = []
    success, step, loss_sum, since_eval, dense = 0.0, 0, 0.0, 0, False
    started = last_shown = time.monotonic()
    while step < config.max_steps:
        if len(order) < config.batch_size:
            order = list(range(len(data)))
            rng.shuffle(order)
            order *= -(-config.batch_size // len(order))  # fewer demonstrations than a batch: each more than once
        batch = [data[order.pop()] for _ in range(config.batch_size)]
        model.train()
        loss = masked_lm_loss(model, batch, tokenizer.pad_token_id)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        step += 1
        loss_sum += loss.item()
        since_eval += 1
        if dense or step % config.eval_every == 0 or step == config.max_steps:
            outcomes = _check(model, eval_fn, config, screen=dense and step < config.max_steps)
            success = sum(outcomes) / len(outcomes)
            dense = dense or success >= config.dense_eval_from
            row = {"step": step, "loss": loss_sum / since_eval, "success": success, "episodes": len(outcomes),
                   "seconds": time.monotonic() - started}
            history.append(row)
            loss_sum, since_eval = 0.0, 0
            logger.info("warm-up step %d: loss %.3f, held-out greedy success %.2f (%d episodes)", step, row["loss"],
                        success, len(outcomes))
            last_shown = time.monotonic()
            if success >= config.stop_success:
                break
        elif time.monotonic() - last_shown >= PROGRESS_EVERY_S:
            # Checks may be hundreds of steps apart (the multi-task preset checks once, at its end).
            logger.info("warm-up step %d/%d: loss %.3f, %.2f s a step", step, config.max_steps,
                        loss_sum / since_eval, (time.monotonic() - started) / step)
            last_shown = time.monotonic()
    output_dir = Path(output_dir)
    model.cpu().save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    del model, optimizer
    release_device_memory(device)
    return WarmupResult(str(output_dir), step, success, device, history)


def release_device_memory(device: str) -> None:
    """Give what this process freed back to the system: the blocks torch's caching allocator keeps on a GPU, the
    heap pages glibc keeps on the CPU.

    The warm-up and the evaluations run in the demo's process while verl's trainer and rollout servers share the
    device: without this, what the warm-up's activations once took stays reserved here (39 GiB of an H100 with
    SmolLM2) and verl's first update runs out of memory; on the CPU glibc keeps freed blocks (the smoke of
    ``demo --model smollm2`` held 7.9 GB in the demo's process when Ray's memory monitor killed verl's workers on a
    24 GB machine). Call it once the process holds no tensor on ``device``.
    """
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
    elif _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def device_setting(setting: str, key: str) -> str:
    """A device setting (``key``: ``warmup.device``, ``rl.device``) resolved to a torch device name.

    Raises:
        ValueError: not ``cpu``, ``cuda`` or ``auto``, or ``cuda`` where torch sees no GPU (never a silent fall back
            to the CPU).
    """
    import torch

    if setting not in ("cpu", "cuda", "auto"):
        raise ValueError(f"{key}: {setting!r} is not cpu, cuda or auto")
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{key}: cuda, but torch sees no GPU here; use cpu or auto")
    return setting


def _check(model, eval_fn: HeldOutCheck, config: WarmupConfig, screen: bool) -> list[bool]:
    """One held-out check: every index, or (``screen``) the first ``screen_indices`` and the rest only when those
    reach ``stop_success - screen_margin``, so that a check at or above ``stop_success`` has always played them all."""
    if not screen or config.screen_indices <= 0:
        return eval_fn(model, slice(None))
    first = eval_fn(model, slice(0, config.screen_indices))
    if sum(first) < (config.stop_success - config.screen_margin) * len(first):
        return first
    return first + eval_fn(model, slice(config.screen_indices, None))


Sample = tuple[list[int], list[int]]  # token ids and loss mask of one demonstration
MICRO_BATCH_TOKENS = 2048
"""Most padded tokens per forward pass of the warm-up. A batch is sorted by length and cut into micro-batches of at
most this many, so that short episodes (calc, ~90 tokens) are not padded to the longest of several families (~900).
The loss is the same; a batch of 32 demonstrations of calc, kg, webshop and alfworld took 0.75 s a step instead of
2.4 s (2 threads of an idle 16-core machine; 4096 tokens: 1.05 s)."""


def masked_lm_loss(model, batch: list[Sample], pad_id: int, max_tokens: int = MICRO_BATCH_TOKENS):
    """Token-mean next-token loss over the tokens whose mask is 1, over length-sorted micro-batches of at most
    ``max_tokens`` padded tokens (one graph: the loss and gradient of the whole batch).

    The output layer and softmax run on the positions that predict a trained token only: most positions are context
    (prompts, tool replies), and the output layer is about a fifth of the tiny model's work per position."""
    import torch

    decoder, head = model.get_decoder(), model.get_output_embeddings()
    device = head.weight.device
    loss = 0.0
    for group in length_groups(batch, max_tokens):
        width = max(len(ids) for ids, _ in group)
        ids = torch.tensor([i + [pad_id] * (width - len(i)) for i, _ in group], device=device)
        mask = torch.tensor([m + [0] * (width - len(m)) for _, m in group], device=device)
        attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in group], device=device)
        hidden = decoder(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1]
        trained = mask[:, 1:].bool()
        logits = head(hidden[trained])
        loss = loss + torch.nn.functional.cross_entropy(logits, ids[:, 1:][trained], reduction="sum")
    return loss / sum(sum(m[1:]) for _, m in batch)


def length_groups(batch: list[Sample], max_tokens: int) -> list[list[Sample]]:
    """``batch`` sorted by length and cut where a group padded to its longest sequence would exceed ``max_tokens``
    (a longer sequence is a group of its own)."""
    groups: list[list[Sample]] = [[]]
    for item in sorted(batch, key=lambda x: len(x[0])):
        if groups[-1] and (len(groups[-1]) + 1) * len(item[0]) > max_tokens:
            groups.append([])
        groups[-1].append(item)
    return groups
