"""The facts about vLLM that the backends' tests check: read by the vLLM environment's interpreter."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from agentrl_verl.models.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[3]
FACTS = Path(__file__).with_name("vllm_cpu_facts.py")


@pytest.fixture(scope="session")  # one vLLM interpreter start (20 s here) for both modules that read them
def facts(vllm_python) -> dict:
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "agentrl_verl.plugin",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([vllm_python, str(FACTS), str(build_tiny_model())], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
