"""The one ``verl.plugins`` entry point: registers every agentrl_verl component with verl's registries.

verl imports this module on ``import verl`` in the driver and in every Ray worker. verl swallows plugin
import errors at DEBUG level, so failures are logged here at ERROR level before being re-raised, and
``tests/agentrl_verl/test_plugin.py`` asserts that registration really happened.

Each module in :data:`COMPONENTS` has a ``register()`` function that is called once.
"""

from __future__ import annotations

import importlib
import logging

logger = logging.getLogger(__name__)

COMPONENTS: tuple[str, ...] = (
    "agentrl_verl.backends.vllm_cpu",  # first: verl's vLLM modules look up the `vllm` distribution on import
    "agentrl_verl.backends.vllm_server",
    "agentrl_verl.backends.platform_cpu",
    "agentrl_verl.backends.hf_rollout",
    "agentrl_verl.core.agent_loop",
    "agentrl_verl.core.trainer",
    "agentrl_verl.core.async_trainer",
    "agentrl_verl.backends.object_store_engine",  # cross-policy sampling: weight sync of standalone replicas on CPU
)

_registered = False


def register() -> None:
    """Register all components (idempotent)."""
    global _registered
    if _registered:
        return
    for name in COMPONENTS:
        try:
            importlib.import_module(name).register()
        except Exception:
            logger.exception("agentrl_verl: registering %s with verl failed", name)
            raise
    _registered = True


register()
