"""Cold start, fast parts: the tokenization and loss mask of demonstrations from the real ``calc`` task, and the
supervised warm-up's optimisation and stopping rule."""

from __future__ import annotations

import itertools
import json
import logging
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl_verl.pipeline import cold_start
from agentrl_verl.pipeline.cold_start import (
    WarmupConfig,
    release_device_memory,
    supervised_warmup,
    tokenize_episode,
)
from env_adapters.demonstrations import Episode, generate_demonstrations


@pytest.fixture(scope="module")
def demos():
    return generate_demonstrations("calc", range(20), {"size": 50})


def test_loss_mask_covers_exactly_the_assistant_tokens(tokenizer, demos):
    for demo in demos:
        ids, mask = tokenize_episode(tokenizer, demo.messages, demo.tools)
        assert len(ids) == len(mask)
        # The pieces concatenate to the tokenization of the whole rendered conversation (template round-trip).
        rendered = tokenizer.apply_chat_template(demo.messages, tools=demo.tools, tokenize=False)
        assert ids == tokenizer.encode(rendered, add_special_tokens=False)
        assert tokenizer.decode(ids) == rendered
        # Masked spans are exactly the assistant turns as generated: content/tool calls plus <|im_end|>.
        texts = _assistant_spans(tokenizer, demo)
        assistants = [m for m in demo.messages if m["role"] == "assistant"]
        assert len(texts) == len(assistants)
        for text, message in zip(texts, assistants, strict=True):
            assert text.endswith("<|im_end|>") and "<|im_start|>" not in text
            call = message["tool_calls"][0]["function"]
            assert json.loads(text.removeprefix("<tool_call>\n").split("\n</tool_call>")[0]) == {
                "name": call["name"], "arguments": json.loads(call["arguments"])}


def _assistant_spans(tokenizer, demo: Episode) -> list[str]:
    """The demonstration's assistant turns as the model would generate them (the masked spans, decoded)."""
    ids, mask = tokenize_episode(tokenizer, demo.messages, demo.tools)
    groups = itertools.groupby(zip(ids, mask, strict=True), key=lambda x: x[1])
    return [tokenizer.decode([i for i, _ in span]) for k, span in groups if k]


def test_warmup_lowers_the_loss_and_saves_a_model(model_dir, demos, tmp_path):
    calls = []
    result = supervised_warmup(model_dir, demos, tmp_path / "sft", lambda model, part: calls.append(part) or [False],
                               WarmupConfig(max_steps=6, batch_size=8, eval_every=3))
    assert result.steps == 6 and calls == [slice(None)] * 2 and len(result.history) == 2
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    reloaded = AutoModelForCausalLM.from_pretrained(result.path)
    assert sum(p.numel() for p in reloaded.parameters()) > 0
    assert AutoTokenizer.from_pretrained(result.path)("x")["input_ids"]



def test_warmup_shows_progress_between_sparse_checks(model_dir, demos, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(cold_start, "PROGRESS_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger=cold_start.__name__):
        supervised_warmup(model_dir, demos, tmp_path / "sft", lambda model, part: [False],
                          WarmupConfig(max_steps=4, batch_size=4, eval_every=4))
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == [f"warm-up step {s}/4" for s in (1, 2, 3)] + ["warm-up step 4"]
    assert all("s a step" in line for line in lines[:3])


class HeldOut:
    """A stand-in for the held-out evaluation: 20 indices, the number of successes at each check given up front
    (the first indices succeed); records what each check played."""

    def __init__(self, successes: list[int]) -> None:
        self.successes, self.parts = iter(successes), []
        self.current: list[bool] = []

    def __call__(self, model, part: slice) -> list[bool]:
        if part.start in (None, 0):  # a new check
            n = next(self.successes)
            self.current = [i < n for i in range(20)]
        self.parts.append((part.start, part.stop))
        return self.current[part]


def test_warmup_evaluates_every_step_once_success_starts_and_stops_in_the_window(model_dir, demos, tmp_path):
    held_out = HeldOut([0, 2, 6, 14, 18])
    result = supervised_warmup(model_dir, demos, tmp_path / "sft", held_out,
                               WarmupConfig(max_steps=20, batch_size=4, eval_every=3, dense_eval_from=0.05,
                                            stop_success=0.6, screen_indices=0))
    # Every 3 steps until 0.1 >= 0.05, then every step; stops at the first evaluation >= 0.6.
    assert [row["step"] for row in result.history] == [3, 6, 7, 8]
    assert result.steps == 8 and result.success == 0.7
    assert held_out.parts == [(None, None)] * 4


def test_micro_batches_by_length_give_the_loss_and_gradient_of_the_whole_batch(model_dir, tokenizer, demos):
    import torch

    from agentrl_verl.pipeline.cold_start import length_groups, masked_lm_loss

    short = [tokenize_episode(tokenizer, d.messages, d.tools) for d in demos[:6]]
    batch = [*short, (short[0][0] * 3, short[0][1] * 3), (short[1][0] * 5, short[1][1] * 5)]  # three lengths
    assert [len(g) for g in length_groups(batch, 8 * len(short[0][0]))] == [6, 1, 1]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    results = []
    for max_tokens in (10**9, 1):  # one padded batch; every sequence on its own
        model.zero_grad()
        loss = masked_lm_loss(model, batch, tokenizer.pad_token_id, max_tokens)
        loss.backward()
        results.append((loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    assert torch.allclose(results[0][1], results[1][1], rtol=1e-4, atol=1e-7)
    # The output layer only at trained positions: the loss of the model's own full-logits loss (labels -100 elsewhere).
    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in batch])
    labels = torch.tensor([[t if m else -100 for t, m in zip(i, mask, strict=True)] + [-100] * (width - len(i))
                           for i, mask in batch])
    attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
    model.zero_grad()
    reference = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    reference.backward()
    assert reference.item() == pytest.approx(results[0][0], rel=1e-5)
    assert torch.allclose(torch.cat([p.grad.flatten() for p in model.parameters()]), results[0][1], rtol=1e-4,
                          atol=1e-7)


def test_a_device_setting_is_resolved_or_named(monkeypatch):
    import torch

    from agentrl_verl.pipeline.cold_start import device_setting

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_setting("auto", "warmup.device") == "cpu" and device_setting("cpu", "warmup.device") == "cpu"
    with pytest.raises(ValueError, match="warmup.device: cuda, but torch sees no GPU here"):
        device_setting("cuda", "warmup.device")
    with pytest.raises(ValueError, match="rl.device: 'gpu' is not cpu, cuda or auto"):
        device_setting("gpu", "rl.device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_setting("auto", "warmup.device") == "cuda" and device_setting("cpu", "warmup.device") == "cpu"


def test_checks_after_every_step_are_screened_and_the_stop_is_decided_on_every_index(model_dir, demos, tmp_path):
    # Successes among 20 indices at each check; the screen is the first 5 (the first n indices succeed).
    held_out = HeldOut([2, 4, 8, 9, 13])
    result = supervised_warmup(model_dir, demos, tmp_path / "sft", held_out,
                               WarmupConfig(max_steps=20, batch_size=4, eval_every=3, dense_eval_from=0.05,
                                            stop_success=0.6, screen_indices=5, screen_margin=0.15))
    # Step 3: every index (0.1 >= 0.05: dense from now on). Steps 4-5: the screen (4/5 and 5/5 succeed) reaches
    # 0.6 - 0.15, so the rest is played too: 0.2 and 0.4, short of the stop. Step 6: 0.45 on all. Step 7: 0.65, stop.
    assert [(row["step"], row["success"], row["episodes"]) for row in result.history] == [
        (3, 0.1, 20), (4, 0.2, 20), (5, 0.4, 20), (6, 0.45, 20), (7, 0.65, 20)]
    assert held_out.parts == [(None, None)] + [(0, 5), (5, None)] * 4
    assert result.steps == 7 and result.success == 0.65


def test_a_screen_short_of_the_stop_plays_no_more_and_checks_stay_dense(model_dir, demos, tmp_path):
    held_out = HeldOut([2, 0, 1, 13])
    result = supervised_warmup(model_dir, demos, tmp_path / "sft", held_out,
                               WarmupConfig(max_steps=20, batch_size=4, eval_every=3, dense_eval_from=0.05,
                                            stop_success=0.6, screen_indices=5, screen_margin=0.15))
    # Steps 4 and 5: 0 and 1 of the 5 screened (< 0.6 - 0.15), nothing more played; after a screen below
    # dense_eval_from the next step is still checked. Step 6: 5/5 screened, then 13/20 = 0.65 on all: stop.
    assert [(row["step"], row["success"], row["episodes"]) for row in result.history] == [
        (3, 0.1, 20), (4, 0.0, 5), (5, 0.2, 5), (6, 0.65, 20)]
    assert held_out.parts == [(None, None), (0, 5), (0, 5), (0, 5), (5, None)]


def test_fewer_demonstrations_than_a_batch_fill_the_batch_with_repeats(model_dir, demos, tmp_path):
    config = WarmupConfig(max_steps=2, batch_size=8, eval_every=2, seed=0)
    result = supervised_warmup(model_dir, demos[:3], tmp_path / "warm", lambda model, part: [False], config)
    assert result.steps == 2 and [row["step"] for row in result.history] == [2]


def test_memory_freed_on_the_cpu_goes_back_to_the_system():
    # Blocks of the size of one layer's KV cache of one episode: glibc keeps them in its heap once freed, and the
    # demo's process would hold them while verl's workers need the memory.
    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = rss()
    blocks = [torch.ones(3, 64, 700 + i % 300) for i in range(1500)]  # ~1 GB
    held = rss()
    del blocks
    release_device_memory("cpu")
    assert held - before > 800 * 2**20
    assert rss() - before < (held - before) / 10
