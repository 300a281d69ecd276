"""Fixtures shared by the training-side tests: the tiny offline model and its tokenizer (built once, cached), and
the vLLM environment's interpreter."""

import pytest
from transformers import AutoTokenizer

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.harness.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def model_dir():
    return build_tiny_model()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM environment's python (``bash scripts/setup.sh --vllm``); a test that needs it fails without it."""
    try:
        return vllm_cpu.vllm_python()
    except FileNotFoundError as e:
        pytest.fail(str(e))
