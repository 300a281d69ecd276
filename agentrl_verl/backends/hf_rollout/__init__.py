"""The ``hf`` rollout backend: generation on plain transformers, for hosts without vLLM or SGLang.

Select it with ``actor_rollout_ref.rollout.name=hf``. :func:`register` adds it to verl's two rollout registries:
the replica registry (``RolloutReplicaRegistry``, used by ``LLMServerManager``) and the server-adapter registry
(``verl.workers.rollout.base._ROLLOUT_REGISTRY``, used by trainer and checkpoint-engine workers for weight sync).
"""

from __future__ import annotations

ROLLOUT_NAME = "hf"
ADAPTER_FQN = "agentrl_verl.backends.hf_rollout.adapter.HFServerAdapter"


def _load_replica() -> type:
    from agentrl_verl.backends.hf_rollout.replica import HFReplica

    return HFReplica


def register() -> None:
    """Register the ``hf`` replica and server adapter with verl (imports nothing heavy until used)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from agentrl_verl.core.verl_seam import rollout_adapter_registry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    # verl 0.9.1 has no public API for this registry; the key layout (name, "async") is checked by the tests.
    rollout_adapter_registry()[(ROLLOUT_NAME, "async")] = ADAPTER_FQN


register()  # importing the module registers it: agentrl_verl.plugin imports it with its verl package
