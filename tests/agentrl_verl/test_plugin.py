"""`import verl` must load our plugin and register every component (verl hides plugin errors at DEBUG)."""

import json
import subprocess
import sys
from importlib.metadata import entry_points

PROBE = r"""
import json, sys
import verl
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
out = {"plugin_loaded": "agentrl_verl.plugin" in sys.modules}
out["registered"] = sys.modules["agentrl_verl.plugin"]._registered if out["plugin_loaded"] else False
print(json.dumps(out))
"""


def _probe() -> dict:
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert names.get("agentrl_verl") == "agentrl_verl.plugin"


def test_import_verl_registers_plugin():
    out = _probe()
    assert out == {"plugin_loaded": True, "registered": True}
