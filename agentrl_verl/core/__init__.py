"""The AgentRL mechanisms and their verl wiring.

Pure algorithm modules (no verl): :mod:`.advantage` (GRPO + task normalisation), :mod:`.cross_policy` (per-turn
router, turn bookkeeping), :mod:`.staleness` (admission pacing under a version bound), :mod:`.episode` (the
episode record every consumer reads, and the one success definition). Their verl wiring:
:mod:`.agent_loop` (one multi-turn episode), :mod:`.policy_pool` (the cross-policy pool in verl's rollout layer),
:mod:`.trainer` (``agentrl_sync``) and :mod:`.async_trainer` (``agentrl_async``).
"""
