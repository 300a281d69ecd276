"""The ``hf_rollout`` bench's models: the real architectures it measures, built on the meta device (no weights)."""

from __future__ import annotations

import pytest
import torch

from bench.hf_rollout import build_model


@pytest.mark.parametrize(("name", "architecture", "params_m"),
                         [("smollm2-135m", "LlamaForCausalLM", 134.5), ("qwen2-0.5b", "Qwen2ForCausalLM", 494.0)])
def test_each_shape_is_the_real_models_architecture(name, architecture, params_m):
    model = build_model(name, torch.device("meta"), torch.bfloat16)
    assert type(model).__name__ == architecture
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(params_m, abs=0.05)


def test_an_unknown_model_names_the_known_ones():
    with pytest.raises(ValueError, match="use tiny or one of qwen2-0.5b, smollm2-135m"):
        build_model("gpt2", torch.device("meta"), torch.float32)
