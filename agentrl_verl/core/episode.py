"""The episode record: what ``agentrl_agent`` writes into each trajectory's ``extra_fields``, and the one definition of
a successful episode.

The agent loop writes an :class:`EpisodeRecord` (as a plain dict, so that it survives TransferQueue and JSON dumps);
the trainers' per-task metrics, the evaluator and the cross-policy metrics read it back with
:meth:`EpisodeRecord.from_extra_fields`. Success is :func:`is_success` everywhere: training metrics, held-out
evaluation, demonstrations and cross-policy success rates agree on every family, partial rewards included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from env_adapters.protocol import is_success


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode of the agent loop.

    Attributes:
        task: The task name (the dataset row's ``data_source``).
        status: The environment's final status (``completed``, ``task limit reached``, ...).
        reward: What training used: the environment's reward if ``completed``, else the loop's penalty.
        env_reward: The environment's reward.
        turns: Assistant turns generated.
        env_latency_s: Seconds spent waiting for the environment.
        generate_s: Seconds spent waiting for the policy's generations.
        generated_tokens: Tokens the policy generated.
        env_tokens: Tokens of the environment's messages.
        resumed_turns: Turns interrupted by a weight update and finished on the new weights.
        env_retries: Attempts the environment lost before this one (each played again on the same prompt).
        env_unavailable_s: Seconds from the first loss to the attempt that went through.
        min_global_steps: Oldest weight version of the trained policy's turns (the staleness bound's input).
        max_global_steps: Newest weight version of the trained policy's turns.
        turn_fields: The turn log (:meth:`agentrl_verl.core.cross_policy.TurnLog.to_extra_fields`): per generated
            turn its pool member, the weight version it started on and its tokens.
    """

    task: str
    status: str
    reward: float
    env_reward: float
    turns: int
    env_latency_s: float = 0.0
    generate_s: float = 0.0
    generated_tokens: int = 0
    env_tokens: int = 0
    resumed_turns: int = 0
    env_retries: int = 0
    env_unavailable_s: float = 0.0
    min_global_steps: int | None = None
    max_global_steps: int | None = None
    turn_fields: dict[str, Any] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        """:func:`is_success` of this episode."""
        return is_success(self.status, self.env_reward)

    def to_extra_fields(self) -> dict[str, Any]:
        """The trajectory's ``extra_fields``: every attribute at the top level, the turn log's keys included."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "turn_fields"}
        return {**fields, **self.turn_fields}

    @classmethod
    def from_extra_fields(cls, extra: Any) -> EpisodeRecord | None:
        """The record of a trajectory's ``extra_fields``; None for a row the agent loop did not write (no ``task``)."""
        if not isinstance(extra, Mapping) or "task" not in extra:
            return None
        names = {f.name for f in dataclasses.fields(cls)} - {"turn_fields"}
        known = {k: v for k, v in extra.items() if k in names}
        known["task"] = str(known["task"])
        return cls(**known, turn_fields={k: v for k, v in extra.items() if k not in names})
