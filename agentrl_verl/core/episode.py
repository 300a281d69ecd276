"""The episode record: what ``agentrl_agent`` hands to the trainers with each trajectory, and the one definition of
a successful episode.

The agent loop writes an :class:`EpisodeRecord` into the trajectory's ``extra_fields`` as one namespaced, versioned
field (:data:`RECORD_KEY`, plain values so that it survives TransferQueue and JSON dumps) beside the two keys verl
itself reads (``min_global_steps``/``max_global_steps``: the weight versions the trajectory's trained turns span,
which verl's TransferQueue tags and staleness metrics take). The trainers' per-task metrics, the staleness bound,
the cross-policy metrics and the evaluator read it back only through :meth:`EpisodeRecord.from_extra_fields`.
Success is :func:`is_success` everywhere: training metrics, held-out evaluation, demonstrations and cross-policy
success rates agree on every family, partial rewards included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl_verl.core.cross_policy import TurnLog
from env_adapters.protocol import is_success

RECORD_KEY = "agentrl_episode"
"""The trajectory's extra field holding its record (one field: verl copies every extra field of every trajectory into
the batch, so the record's own names stay out of verl's)."""
RECORD_VERSION = 1
"""The record's layout; a record of another layout is refused by name rather than read wrongly."""
VERL_VERSION_RANGE = ("min_global_steps", "max_global_steps")
"""verl's names for the weight versions a trajectory's trained turns span (its TransferQueue tags read them)."""


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
        oldest_version: The oldest weight version the trained policy's turns started on (the staleness bound's
            input); written for verl as ``min_global_steps``.
        newest_version: The newest one; for verl, ``max_global_steps``.
        turn_log: Per generated turn, its pool member, the weight version it started on and its tokens.
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
    oldest_version: int | None = None
    newest_version: int | None = None
    turn_log: TurnLog = field(default_factory=TurnLog)

    @property
    def success(self) -> bool:
        """:func:`is_success` of this episode."""
        return is_success(self.status, self.env_reward)

    def to_extra_fields(self) -> dict[str, Any]:
        """The trajectory's ``extra_fields``: the record under :data:`RECORD_KEY`, and verl's version range."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "turn_log"}
        record = {"version": RECORD_VERSION, **fields, "turn_log": self.turn_log.to_fields()}
        return {RECORD_KEY: record, **dict(zip(VERL_VERSION_RANGE, (self.oldest_version, self.newest_version),
                                               strict=True))}

    @classmethod
    def of(cls, output: Any) -> EpisodeRecord | None:
        """The record an agent loop output (``AgentLoopOutput``) carries in its ``extra_fields``."""
        return cls.from_extra_fields(output.extra_fields)

    @classmethod
    def from_extra_fields(cls, extra: Any) -> EpisodeRecord | None:
        """The record of a trajectory's ``extra_fields``; None for a row the agent loop did not write.

        Raises:
            ValueError: a record of another layout (:data:`RECORD_VERSION`).
        """
        record = extra.get(RECORD_KEY) if isinstance(extra, Mapping) else None
        if record is None:
            return None
        if record.get("version") != RECORD_VERSION:
            raise ValueError(f"episode record of layout {record.get('version')!r}, this agentrl_verl reads "
                             f"{RECORD_VERSION}: the trajectory was written by another version")
        fields = {k: v for k, v in record.items() if k not in ("version", "turn_log")}
        return cls(**{**fields, "task": str(fields["task"])}, turn_log=TurnLog.from_fields(record["turn_log"]))
