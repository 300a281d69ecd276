"""``agentrl.env.launch: ray``: the training run starts its environment stack on its own Ray cluster.

The trainer calls :func:`start_env_stack` on the driver's side (verl's task runner) before verl builds any worker:
the stack of ``agentrl.env.stack`` comes up as Ray actors (:class:`~env_adapters.ray_stack.RayEnvStack`), and its URL
and token source are written into the run's ``agentrl.env``, which the agent loop workers read when verl creates
them. The trainer stops the stack when training ends, also on an error; if the run dies, Ray removes the actors
with their owner, and each stack process gets SIGTERM with its actor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import open_dict

from agentrl_verl.core.config import ROOT, AgentRLConfig


def start_env_stack(run_config: Any, agentrl: AgentRLConfig) -> Any | None:
    """Bring the run's environment stack up when ``agentrl.env.launch`` is ``ray``; point ``agentrl.env`` at it.

    Args:
        run_config: The run's OmegaConf config; its ``agentrl.env.url`` (and token source) is set in place.
        agentrl: The validated ``agentrl`` section.

    Returns:
        The started :class:`~env_adapters.ray_stack.RayEnvStack` (stop it with ``stop()``), or None for
        ``launch: url``.
    """
    env = agentrl.env
    if env.launch != "ray":
        return None
    from env_adapters.ray_stack import RayEnvStack

    stack_config = env.stack if isinstance(env.stack, dict) else str(Path(env.stack).expanduser())
    stack = RayEnvStack(stack_config, startup_timeout=env.startup_timeout)
    stack.start()
    spec = stack.config.controller
    with open_dict(run_config):
        section = run_config[ROOT]["env"]
        section["url"] = stack.url
        if section.get("token") or section.get("token_file"):
            pass  # the run names its own token source
        elif spec.token_file:  # the agent loop reads the same file (on every node, as for `agentrl-env up`)
            section["token_file"] = str(Path(spec.token_file).expanduser())
        elif spec.token:
            section["token"] = spec.token
    # Printed, as verl's task runner prints its own progress (its logging shows warnings only).
    print(f"environment stack of {env.stack if isinstance(env.stack, str) else 'agentrl.env.stack'} up at "
          f"{stack.url} for this run ({len(stack.workers)} workers)", flush=True)
    return stack
