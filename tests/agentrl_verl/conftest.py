"""Fixtures shared by the training-side tests: the tiny offline model and its tokenizer (built once, cached)."""

import pytest
from transformers import AutoTokenizer

from agentrl_verl.harness.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def model_dir():
    return build_tiny_model()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)
