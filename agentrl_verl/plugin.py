"""The one ``verl.plugins`` entry point: registers every agentrl_verl component with verl's registries.

verl imports this module on ``import verl`` in the driver and in every Ray worker. A component is registered when
the verl package that holds its registry is first imported (a post-import hook; at once where it already is), so a
Ray worker pays only for what it uses: importing the trainer modes or the agent loop costs seconds in each of a
run's processes, most of which never look them up. verl swallows plugin import errors at DEBUG level, so failures
are logged here at ERROR level before being re-raised (to the import that triggered them), and
``tests/agentrl_verl/test_plugin.py`` asserts that registration really happens.

The plugin calls the idempotent ``register()`` of the modules needed on ``import verl``; the others register when
imported (by a ``register()`` they call at their end, or by a registry's decorator, as the agent loop does), so that
importing one registers it, also when it is imported before verl (its own import of verl then fires the hook while
it is still half-loaded).
"""

from __future__ import annotations

import importlib
import logging
import types
from collections.abc import Callable

import wrapt

logger = logging.getLogger(__name__)

COMPONENTS: dict[str, str | None] = {
    # component module: the verl package whose first import registers it (None: on `import verl`)
    "agentrl_verl.backends.vllm_cpu": None,  # first: verl's vLLM modules look up the `vllm` distribution on import
    "agentrl_verl.backends.vllm_server": None,  # hooks vLLM's own modules
    "agentrl_verl.backends.platform_cpu": None,  # verl resolves its platform on first use, from any module
    "agentrl_verl.backends.hf_rollout": "verl.workers.rollout",
    "agentrl_verl.core.agent_loop": "verl.experimental.agent_loop",
    "agentrl_verl.core.trainer": "verl.trainer.ppo.v1",  # the task_norm_grpo estimator serves only its trainers
    "agentrl_verl.core.async_trainer": "verl.trainer.ppo.v1",
    "agentrl_verl.backends.object_store_engine": "verl.checkpoint_engine",  # cross-policy weight sync on CPU
    "agentrl_verl.backends.chunked_logprobs": "verl.utils.torch_functional",  # log-probs without flash-attn
}
"""A registry's package, not its module, triggers registration (a package's hook runs once all of its modules are
complete); a replaced function's module triggers its replacement."""

_registered = False


def _load(name: str, call_register: bool) -> None:
    try:
        module = importlib.import_module(name)
        if call_register:
            module.register()
    except Exception:
        logger.exception("agentrl_verl: registering %s with verl failed", name)
        raise


def _on_import(name: str) -> Callable[[types.ModuleType], None]:
    def hook(_package: types.ModuleType) -> None:
        _load(name, call_register=False)

    return hook


def register() -> None:
    """Register the components now or on their verl package's first import (idempotent)."""
    global _registered
    if _registered:
        return
    for name, package in COMPONENTS.items():
        if package is None:
            _load(name, call_register=True)
        else:
            wrapt.register_post_import_hook(_on_import(name), package)
    _registered = True


register()
