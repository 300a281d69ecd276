"""Fixtures shared by the training-side tests: the tiny offline model and its tokenizer (built once, cached), the
vLLM environment's interpreter, and a look at the live processes (what a run left behind)."""

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.models.tiny import build_tiny_model


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


def _live_processes(*needles: str) -> list[str]:
    """``pid: command line`` of each live process (but this one) whose command line mentions any of ``needles``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            found.append(f"{pid}: {cmdline[:200]}")
    return found


@pytest.fixture(scope="session")
def live_processes() -> Callable[..., list[str]]:
    """:func:`_live_processes`: the processes a run started that are still alive."""
    return _live_processes
