"""`import verl` must load our plugin and register every component (verl hides plugin errors at DEBUG)."""

import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

PROBE = r"""
import json, sys
{first_import}
import verl
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout import base
from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.utils import torch_functional
plugin = sys.modules.get("agentrl_verl.plugin")
print(json.dumps({
    "registered": bool(plugin and plugin._registered),
    "estimator": "task_norm_grpo" in ADV_ESTIMATOR_REGISTRY,
    "agent_loop": "agentrl_agent" in _agent_loop_registry,
    "platform": PlatformRegistry.get("cpu") is not None,
    "trainer_modes": sorted(m for m in TRAINER_REGISTRY if m.startswith("agentrl")),
    "rollout": "hf" in RolloutReplicaRegistry._registry and ("hf", "async") in base._ROLLOUT_REGISTRY,
    "checkpoint_engines": sorted(CheckpointEngineRegistry._registry),
    "logprobs": torch_functional.logprobs_from_logits_v2.__module__,
}))
"""

EXPECTED = {
    "registered": True,
    "estimator": True,
    "agent_loop": True,
    "platform": True,
    "trainer_modes": ["agentrl_async", "agentrl_sync"],
    "rollout": True,
    "logprobs": "agentrl_verl.backends.chunked_logprobs",
}


def _probe(first_import: str = "") -> dict:
    code = PROBE.replace("{first_import}", first_import)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert names.get("agentrl_verl") == "agentrl_verl.plugin"


@pytest.mark.parametrize("first_import", ["", "import agentrl_verl.core.async_trainer"])
def test_import_verl_registers_every_component(first_import):
    """Also when a component module is imported before verl (no circular half-import)."""
    out = _probe(first_import)
    engines = out.pop("checkpoint_engines")
    assert out == EXPECTED
    assert "ray_object_store" in engines, engines


def test_a_component_loads_with_the_verl_package_of_its_registry_only():
    """A Ray worker that never looks a component up does not import it (the trainers and the agent loop cost seconds
    in each of a run's processes); importing the registry's package registers it."""
    code = """
import json, sys
import verl
before = sorted(m for m in ("agentrl_verl.core.trainer", "agentrl_verl.core.async_trainer",
                            "agentrl_verl.core.agent_loop", "verl.trainer.ppo.v1") if m in sys.modules)
import verl.trainer.ppo.v1
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
print(json.dumps({"before": before, "loaded": "agentrl_verl.core.async_trainer" in sys.modules,
                  "modes": sorted(m for m in TRAINER_REGISTRY if m.startswith("agentrl"))}))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"before": [], "loaded": True, "modes": ["agentrl_async", "agentrl_sync"]}
