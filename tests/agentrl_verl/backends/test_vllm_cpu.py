"""verl's vLLM rollout on CPU: each fix of :mod:`agentrl_verl.backends.vllm_cpu` and each setting of the
``cpu_vllm`` preset is still needed and still right for the installed vLLM and verl.

The facts about vLLM come from ``vllm_cpu_facts.py`` run by the vLLM environment's interpreter
(``bash scripts/setup.sh --vllm``); the rest runs here, where vLLM is not installed.
"""

from __future__ import annotations

import _multiprocessing
import json
import multiprocessing
import os
import subprocess
import sys
import uuid
from multiprocessing import synchronize
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from agentrl_verl.backends import vllm_cpu
from agentrl_verl.models.tiny import build_tiny_model
from agentrl_verl.presets import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[3]
GiB = 1 << 30



def preset(name: str, *overrides: str) -> DictConfig:
    """The preset ``name`` with ``overrides`` as main_ppo composes it (what ``--cfg job`` prints)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=list(overrides))


@pytest.fixture(scope="module")
def rollout():
    """The rollout section of the ``cpu_vllm`` preset."""
    return preset(vllm_cpu.PRESET).actor_rollout_ref.rollout


def differences(a: dict, b: dict, prefix: str = "") -> set[str]:
    """The dotted keys whose values differ between the nested dicts ``a`` and ``b``."""
    keys = set()
    for key in a.keys() | b.keys():
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            keys |= differences(x, y, f"{prefix}{key}.")
        elif x != y:
            keys.add(f"{prefix}{key}")
    return keys


VLLM_SETTINGS = {f"actor_rollout_ref.rollout.{key}" for key in (
    "name", "enable_sleep_mode", "enforce_eager", "engine_kwargs.vllm.kv_cache_memory_bytes",
    "engine_kwargs.vllm.compilation_config",
    "checkpoint_engine.update_weights_bucket_megabytes")}


@pytest.mark.parametrize("layer", [[], ["+demo=tiny"]], ids=["alone", "demo"])
def test_cpu_vllm_is_cpu_tiny_with_the_vllm_settings(layer):
    # --config-name cpu_vllm is cpu_tiny (also under the demo's layer) with the vLLM settings, nothing else.
    tiny, vllm = (OmegaConf.to_container(preset(name, *layer)) for name in ("cpu_tiny", vllm_cpu.PRESET))
    assert differences(tiny, vllm) == VLLM_SETTINGS
    assert vllm["actor_rollout_ref"]["rollout"]["name"] == "vllm"


@pytest.fixture(scope="module")
def verl_rollout_defaults():
    from verl.workers.config import RolloutConfig

    return RolloutConfig


def test_the_fixes_apply_nowhere_else():
    # Here (no vllm-cpu, vLLM not loaded) the plugin changes nothing.
    assert vllm_cpu.alias_vllm_cpu_distribution() is False
    assert vllm_cpu.keep_plain_linear_weights() is False
    assert not any(isinstance(finder, vllm_cpu.VllmCpuAlias) for finder in sys.meta_path)


@pytest.mark.vllm  # reads facts from the vLLM environment
def test_distribution_alias_is_needed_and_right(facts):
    assert not facts["vllm_dist_before_alias"], (
        "the vLLM environment has a distribution named `vllm` of its own: VllmCpuAlias is unnecessary, drop it")
    assert facts["verl_looks_up"] == "vllm", "verl no longer looks up the distribution `vllm`: re-check the alias"
    assert facts["vllm_version"].endswith("+cpu"), facts["vllm_version"]
    assert facts["verl_vllm_version"] == facts["vllm_version"], "verl does not accept the aliased vLLM version"
    assert facts["platform_is_cpu"], "vLLM did not pick its CPU platform with the aliased version"


@pytest.mark.vllm  # reads facts from the vLLM environment
def test_plain_linear_weights_are_needed_and_right(facts):
    assert facts["onednn_built"] and facts["dispatch_default"]["weight_numel"] == 0, (
        "vLLM's CPU GEMM dispatch keeps the Linear weight Parameter by default now: the weight-sync fix "
        "(vllm._custom_ops._supports_onednn = False) is unnecessary, drop it")
    assert facts["fix_applies"]
    assert facts["dispatch_fixed"] == {"weight_numel": 64 * 32, "output_ok": True}, (
        "with _supports_onednn = False vLLM no longer keeps a plain F.linear weight: the weight-sync fix is wrong")



def leak_semaphore() -> str:
    """A named semaphore of this process's name (multiprocessing's) as a killed process leaves it: closed (unmapped)
    and never unlinked."""
    name = synchronize.SemLock._make_name()
    _multiprocessing.SemLock(1, 1, 1, name, False)  # semaphore kind, value 1, closed when collected (at once)
    return f"sem.{name[1:]}"


@pytest.fixture
def semprefix(monkeypatch) -> None:
    """multiprocessing's semaphore names as they were before the test (which may change them)."""
    process = multiprocessing.current_process()
    monkeypatch.setattr(process, "_config", dict(process._config))


def test_a_runs_processes_and_their_children_name_their_semaphores_after_the_run(monkeypatch, semprefix):
    run_id = uuid.uuid4().hex
    monkeypatch.setenv(vllm_cpu.RUN_ID_ENV, run_id)
    vllm_cpu.register()  # as verl does in every process of a run
    semaphores = vllm_cpu.run_prefixes(run_id)[-1]
    lock = multiprocessing.get_context("spawn").Lock()
    assert f"sem.{lock._semlock.name[1:]}" in vllm_cpu.shm_segments((semaphores,))
    # A process the run's process spawns (as verl's server spawns vLLM's engine process) names its own alike.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert f"sem.{pool.apply(synchronize.SemLock._make_name)[1:]}".startswith(semaphores)


def test_leftovers_are_removed_only_when_new_unmapped_and_for_semaphores_the_runs(semprefix):
    from multiprocessing import resource_tracker, shared_memory

    run_id = uuid.uuid4().hex
    old = shared_memory.SharedMemory(create=True, size=64)  # psm_*: there before the run
    existing = vllm_cpu.shm_segments()
    live = shared_memory.SharedMemory(create=True, size=64)  # new, still mapped here
    leaked = shared_memory.SharedMemory(create=True, size=64)  # new, mapped by nobody (its owner was killed)
    leaked.close()
    resource_tracker.unregister(leaked._name, "shared_memory")  # the test removes it, not the tracker
    others = [leak_semaphore()]  # another program's, left during the run
    vllm_cpu.name_semaphores_after_run(uuid.uuid4().hex)
    others.append(leak_semaphore())  # another run's
    vllm_cpu.name_semaphores_after_run(run_id)
    ours = leak_semaphore()  # the run's, its process and resource tracker killed
    live_lock = multiprocessing.get_context("spawn").Lock()  # the run's, mapped only under its creation name
    try:
        old.close()  # unmapped, but older than the run: not ours to remove
        prefixes = vllm_cpu.run_prefixes(run_id)
        # Among this test's segments (other tests' processes may come and go in the same folder meanwhile):
        mine = {old.name, live.name, leaked.name, ours, f"sem.{live_lock._semlock.name[1:]}", *others}
        assert vllm_cpu.leftover_segments(existing, prefixes) & mine == {leaked.name, ours}
        assert set(vllm_cpu.remove_leftover_segments(existing, prefixes)) & mine == {leaked.name, ours}
        left = vllm_cpu.shm_segments((*vllm_cpu.LEFTOVER_PREFIXES, vllm_cpu.SEMAPHORE_PREFIX))
        assert {old.name, live.name, f"sem.{live_lock._semlock.name[1:]}", *others} <= left
        assert not {leaked.name, ours} & left
    finally:
        for segment in (old, live):
            segment.close()
            segment.unlink()
        for name in others:
            os.unlink(os.path.join(vllm_cpu.SHM_DIR, name))


def test_the_driver_is_recognised_while_verl_loads_its_plugins(tmp_path):
    # A stand-in for verl whose import loads the plugin, as verl's does: Python imports it while it still locates
    # `verl.trainer.main_ppo`, before that module is __main__.
    (tmp_path / "verl" / "trainer").mkdir(parents=True)
    (tmp_path / "verl" / "__init__.py").write_text(
        "from agentrl_verl.backends import vllm_cpu\nprint('driver' if vllm_cpu._is_driver() else 'other')\n")
    (tmp_path / "verl" / "trainer" / "__init__.py").write_text("")
    (tmp_path / "verl" / "trainer" / "main_ppo.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    commands = {("-m", "verl.trainer.main_ppo", "trainer.device=cpu"): "driver", ("-c", "import verl"): "other",
                ("-m", "verl.trainer"): "other"}
    for args, role in commands.items():
        proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)
        assert proc.stdout.split() == [role], (args, proc.stdout, proc.stderr[-2000:])


# A process of a run that maps a segment nobody will unlink (as vLLM's engine processes do when they are stopped),
# and takes a second to exit when asked to.
SEGMENT_HOLDER = """
import signal, sys, time
from multiprocessing import resource_tracker, shared_memory
segment = shared_memory.SharedMemory(create=True, size=64)
resource_tracker.unregister(segment._name, "shared_memory")
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))
print(segment.name, flush=True)
time.sleep(600)
"""


def test_the_drivers_exit_hook_stops_ray_then_removes_what_the_run_left(monkeypatch):
    run_id = uuid.uuid4().hex
    existing = vllm_cpu.shm_segments()
    holder = subprocess.Popen([sys.executable, "-c", SEGMENT_HOLDER], env={**os.environ, vllm_cpu.RUN_ID_ENV: run_id},
                              stdout=subprocess.PIPE, text=True)
    name = holder.stdout.readline().strip()
    try:
        assert holder.pid in vllm_cpu.run_processes(run_id)  # (with its resource tracker)
        assert name in vllm_cpu.shm_segments() and vllm_cpu.leftover_segments(existing) == set()  # mapped

        class Ray:  # Ray's shutdown stops the run's processes, vLLM's among them
            shutdowns = 0

            @staticmethod
            def is_initialized() -> bool:
                return Ray.shutdowns == 0

            @staticmethod
            def shutdown(**_: Any) -> None:
                Ray.shutdowns += 1
                holder.terminate()

        monkeypatch.setitem(sys.modules, "ray", Ray)
        vllm_cpu._clean_up_at_exit(run_id, existing)
        assert Ray.shutdowns == 1
        assert vllm_cpu.run_processes(run_id) == []  # waited for the holder to exit
        assert name not in vllm_cpu.shm_segments()
    finally:
        holder.kill()
        holder.wait()
        if name in vllm_cpu.shm_segments():
            os.unlink(os.path.join(vllm_cpu.SHM_DIR, name))


@pytest.mark.vllm  # reads facts from the vLLM environment
def test_sleep_mode_off_is_needed(facts, rollout, verl_rollout_defaults):
    assert not facts["sleep_mode_available"], "vLLM's CPU platform supports sleep mode now: drop the override"
    assert verl_rollout_defaults.enable_sleep_mode is True, "verl turns sleep mode off by default: drop the override"
    assert rollout.enable_sleep_mode is False


@pytest.mark.vllm  # reads facts from the vLLM environment
def test_eager_mode_is_needed(facts, rollout, verl_rollout_defaults):
    # Without enforce_eager vLLM's CPU platform compiles the model with inductor (minutes on a small machine).
    assert facts["compilation_mode_eager_False"] != "NONE", "vLLM on CPU no longer compiles: drop enforce_eager"
    assert facts["compilation_mode_eager_True"] == "NONE", "enforce_eager no longer turns compilation off on CPU"
    assert verl_rollout_defaults.enforce_eager is False, "verl is eager by default: drop the override"
    assert rollout.enforce_eager is True


@pytest.mark.vllm  # reads facts from the vLLM environment
def test_kv_cache_has_a_fixed_size(facts, rollout, verl_rollout_defaults):
    # Without an explicit size vLLM's CPU worker reserves gpu_memory_utilization x its "device" memory per replica:
    # the first NUMA node's memory, which is the host's where the kernel shows no nodes (on some virtual machines
    # node 0 holds less than the host: 18.6 of 25.3 GB).
    node = Path("/sys/devices/system/node/node0/meminfo")
    if node.exists():
        total_kb = next(int(line.split()[3]) for line in node.read_text().splitlines() if "MemTotal:" in line)
        device = total_kb * 1024
    else:
        device = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert facts["device_total_memory"] == device, "vLLM's CPU 'device' memory is no longer NUMA node 0's"
    assert verl_rollout_defaults.gpu_memory_utilization * device > GiB, "verl's default share changed: re-check ours"
    assert facts["kv_cache_memory_bytes"] == 1 << 28, "vLLM ignores kv_cache_memory_bytes: re-check the preset"
    assert facts["cpu_worker_reads_kv_bytes"], "vLLM's CPU worker no longer reads kv_cache_memory_bytes"
    kv_bytes = rollout.engine_kwargs.vllm.kv_cache_memory_bytes
    # The preset's max_num_seqs sequences of prompt + response length of the tiny model (fp32) fit many times over.
    model = json.loads((build_tiny_model() / "config.json").read_text())
    head_dim = model["hidden_size"] // model["num_attention_heads"]
    per_token = model["num_hidden_layers"] * 2 * model["num_key_value_heads"] * head_dim * 4  # K and V, fp32
    need = rollout.max_num_seqs * (rollout.prompt_length + rollout.response_length) * per_token
    assert 4 * need <= kv_bytes <= GiB, (need, kv_bytes)
    assert rollout.name == "vllm"

def test_demo_engine_vllm_runs_main_ppo_from_the_vllm_environment(tmp_path, monkeypatch):
    from agentrl_verl.pipeline.launch import rl_command, rl_preset_values
    from agentrl_verl.pipeline.settings import RLSpec

    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setenv(vllm_cpu.PYTHON_ENV, str(python))
    spec = RLSpec(steps=2, engine="vllm", overrides=["actor_rollout_ref.rollout.n=4"])
    cmd = rl_command("MODEL", tmp_path / "t.parquet", tmp_path / "v.parquet", "URL", tmp_path, tmp_path, spec)
    assert cmd[0] == str(python)
    assert cmd[cmd.index("--config-name") + 1:][:2] == [vllm_cpu.PRESET, "+demo=tiny"]
    assert cmd[-1] == "actor_rollout_ref.rollout.n=4"  # the user's overrides win
    values = rl_preset_values(spec)
    assert values.actor_rollout_ref.rollout.name == "vllm"
    assert values.actor_rollout_ref.rollout.agent.default_agent_loop == "agentrl_agent"  # the demo's layer
    hf = rl_command("MODEL", tmp_path, tmp_path, "URL", tmp_path, tmp_path, RLSpec())
    assert hf[0] == sys.executable and hf[hf.index("--config-name") + 1] == "cpu_tiny"
    with pytest.raises(ValueError, match="rl.engine='sglang'"):
        RLSpec(engine="sglang").preset()
    monkeypatch.setenv(vllm_cpu.PYTHON_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="setup.sh --vllm"):
        rl_command("MODEL", tmp_path, tmp_path, "URL", tmp_path, tmp_path, spec)
