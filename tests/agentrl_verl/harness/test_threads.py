"""The demo's thread settings (:mod:`agentrl_verl.harness.threads`): what torch loads with in each process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_verl.harness.threads import demo_thread_environment

THREADS = Path(__file__).resolve().parents[3] / "agentrl_verl" / "harness" / "threads.py"
# A command that relaunches itself as the demo does, then starts a child that looks torch up (as verl's workers and
# vLLM's processes load it). Each prints the wait policy and spin count torch would load with (libgomp reads them
# then) when the import system first looks for it in that process; nothing loads torch, since the environment at
# that moment is the answer. The module is loaded by its path, so that the processes do not import verl.
SPY = ("import importlib.util, os, sys\n"
       "class Spy:\n"
       "    def find_spec(self, name, path=None, target=None):\n"
       "        if name == 'torch':\n"
       "            print(os.environ.get('ROLE'), os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'),"
       " flush=True)\n"
       "sys.meta_path.insert(0, Spy())\n"
       "importlib.util.find_spec('torch')\n")
COMMAND = (SPY + "import importlib.util\n"
           f"spec = importlib.util.spec_from_file_location('threads', {str(THREADS)!r})\n"
           "threads = importlib.util.module_from_spec(spec)\n"
           "spec.loader.exec_module(threads)\n"
           "threads.relaunch_with_demo_threads()\n"
           "import subprocess\n"
           f"subprocess.run([sys.executable, '-c', {SPY!r}], env={{**os.environ, 'ROLE': 'child'}}, check=True)\n")


@pytest.mark.parametrize(("given", "expected"), [
    ({}, ["demo None None", "demo PASSIVE 20000", "child PASSIVE None"]),
    ({"GOMP_SPINCOUNT": "0"}, ["demo None 0", "demo PASSIVE 0", "child PASSIVE 0"]),
    ({"GOMP_SPINCOUNT": "300000"}, ["demo None 300000", "demo PASSIVE 300000", "child PASSIVE 300000"]),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, ["demo ACTIVE None", "child ACTIVE None"]),
], ids=["default", "user-off", "user-count", "user-active"])
def test_the_demo_relaunches_so_only_its_own_process_spins_briefly(given, expected):
    unset = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "AGENTRL_DEMO_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    out = subprocess.run([sys.executable, "-c", COMMAND], env={**env, **given, "ROLE": "demo"}, capture_output=True,
                         text=True, check=True, timeout=300).stdout
    # The first line is torch loading before the relaunch (the process that is then replaced).
    assert out.splitlines() == expected


def test_importing_the_package_leaves_openmp_to_its_defaults():
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    package = SPY.replace("importlib.util.find_spec('torch')", "import agentrl_verl")  # which imports torch
    out = subprocess.run([sys.executable, "-c", package], env={**env, "ROLE": "gpu-run"}, capture_output=True,
                         text=True, check=True, timeout=300).stdout
    assert out.splitlines() == ["gpu-run None None"]


def test_a_relaunched_process_is_not_relaunched_again():
    env = demo_thread_environment({"PATH": "/bin"})
    assert env is not None and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert demo_thread_environment(env) is None
