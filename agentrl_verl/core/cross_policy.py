"""Cross-policy sampling (AgentRL, arXiv 2510.04206): every turn's action comes from a policy drawn from a pool.

In training the pool is the current policy plus a stale copy whose weights are refreshed only every ``K`` steps, or
plus a fixed other model (``fixed_model_path``), so one trajectory mixes turns of both; at evaluation the pool can
be any set of models (named endpoints). This module holds the algorithm only, as pure Python that can be read and
tested without verl, Ray or torch:

1. :func:`training_pool` - the current/stale (or current/fixed) pool of training (options: ``agentrl.cross_policy``,
   :class:`~agentrl_verl.core.config.CrossPolicyConfig`).
2. :class:`PolicyRouter` - the per-turn choice. Each draw is a pure function of ``(seed, trajectory id, turn)``
   (a keyed hash, not a shared random stream), so a run is reproducible however the asynchronous episodes
   interleave, and ``sticky`` mode (one draw per trajectory, i.e. trajectory-level mixing) needs no state.
3. :class:`TurnLog` - the per-trajectory bookkeeping the agent loop keeps: which policy and which weight version
   produced each turn, and which response tokens that turn owns. It is stored in the sample's extra fields.
4. :func:`stale_version` / :func:`stale_refresh_due` - the refresh schedule of the stale pool.
5. :func:`cross_policy_metrics` - share of turns per pool member, their weight versions and behaviour log-probs,
   and success rate by share of stale turns.

The rollout wiring (replica pools, the pool-aware server client, weight refresh) lives in
:mod:`agentrl_verl.core.policy_pool`.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CURRENT = "current"
"""Pool member name of the policy being trained (the replicas synced after every step)."""
STALE = "stale"
"""Pool member name of the stale copy (replicas synced every ``stale_refresh_steps`` steps)."""
FIXED = "fixed"
"""Pool member name of a fixed model (replicas loaded from ``fixed_model_path``, never synced; no weight version)."""
OFF_POLICY = frozenset({STALE, FIXED})
"""The training pool's second members, whose turns count as stale (in ``stale_turn_share`` and its bins)."""

# Keys of a TokenOutput's ``extra_fields`` (the first two) and of a turn log's fields in the episode record.
POLICY_KEY = "policy"
"""TokenOutput extra field: pool member that generated the turn."""
POLICY_VERSION_KEY = "policy_version"
"""TokenOutput extra field: weight version (training step of the weights) the turn started on; None for a fixed
model."""
TURN_POLICIES_KEY = "turn_policies"
"""Turn log field: pool member of every generated turn, in order."""
TURN_VERSIONS_KEY = "turn_versions"
"""Turn log field: the weight version every generated turn started on (None for a fixed model's turns and where
the server reports none): the one per-turn version list, read by the staleness bound and the cross-policy lag."""
TURN_SPANS_KEY = "turn_spans"
"""Turn log field: ``[start, end)`` of every generated turn in the response token list."""
STALE_TURN_SHARE_KEY = "stale_turn_share"
"""Turn log field: fraction of the trajectory's generated turns that came from a stale member."""


def started_on(output_extra_fields: Mapping[str, Any]) -> int | None:
    """The weight version a turn started on, from its server's ``TokenOutput.extra_fields``: a generation aborted at
    a weight update and resumed on the new weights (``agentrl.async.interrupt``) reports the range it spans
    (``min_global_steps``), and its oldest version covers all its tokens; otherwise ``global_steps``."""
    oldest = output_extra_fields.get("min_global_steps")
    return output_extra_fields.get("global_steps") if oldest is None else oldest


def training_pool(stale_ratio: float, other: str = STALE) -> dict[str, float]:
    """Probabilities of the training pool: current ``1 - stale_ratio``, ``other`` (stale or fixed) ``stale_ratio``."""
    return {CURRENT: 1.0 - stale_ratio, other: stale_ratio}


def _uniform(seed: int, *key: object) -> float:
    """A uniform draw in [0, 1) that depends only on ``seed`` and ``key`` (stable across processes and runs)."""
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return (struct.unpack("<Q", digest)[0] >> 11) * 2.0**-53  # 53 random bits, like random.random()


class PolicyRouter:
    """Chooses the pool member that generates a turn.

    Args:
        probabilities: Pool member name -> non-negative weight (normalised here; need not sum to 1).
        seed: Seed of the draws.
        sticky: One draw per trajectory (every turn of a trajectory goes to the same member).

    Raises:
        ValueError: an empty pool, a negative or non-finite weight, or all weights zero.
    """

    def __init__(self, probabilities: Mapping[str, float], seed: int = 0, sticky: bool = False) -> None:
        if not probabilities:
            raise ValueError("the policy pool is empty: give at least one member with a positive probability")
        bad = {name: p for name, p in probabilities.items() if not math.isfinite(p) or p < 0}
        if bad:
            raise ValueError(f"pool member probabilities must be finite and >= 0, got {bad}")
        total = float(sum(probabilities.values()))
        if total <= 0:
            raise ValueError(f"pool member probabilities are all zero: {dict(probabilities)}")
        self.seed = seed
        self.sticky = sticky
        self.probabilities = {name: p / total for name, p in probabilities.items()}
        # Members with probability 0 never enter the cumulative table, so they can never be drawn.
        self._names = [name for name, p in self.probabilities.items() if p > 0]
        cumulative, acc = [], 0.0
        for name in self._names:
            acc += self.probabilities[name]
            cumulative.append(acc)
        self._cumulative = cumulative

    @property
    def members(self) -> list[str]:
        """All pool member names, in configuration order."""
        return list(self.probabilities)

    def choose(self, trajectory_id: str, turn: int) -> str:
        """The member that generates turn ``turn`` (0-based) of trajectory ``trajectory_id``."""
        if len(self._names) == 1:
            return self._names[0]
        u = _uniform(self.seed, trajectory_id, 0 if self.sticky else turn)
        # Rounding can leave the last cumulative value a hair below 1: clamp into the table.
        return self._names[min(bisect.bisect_right(self._cumulative, u), len(self._names) - 1)]


@dataclass
class TurnLog:
    """Which policy and weight version produced each generated turn of one trajectory, and which tokens it owns.

    The agent loop appends one entry per generation, with the position of that turn's tokens in the response
    (observation tokens in between belong to no turn). ``stale_members`` are the members counted as stale.
    """

    stale_members: frozenset[str] = OFF_POLICY
    policies: list[str] = field(default_factory=list)
    versions: list[int | None] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)

    def record(self, output_extra_fields: Mapping[str, Any], start: int, num_tokens: int) -> None:
        """Record a generated turn from the server output's extra fields.

        Args:
            output_extra_fields: ``TokenOutput.extra_fields`` of the turn (``policy``, ``policy_version``; a
                server without a pool reports neither: the turn counts as ``current``, at :func:`started_on`).
            start: Index of the turn's first token in the response token list.
            num_tokens: Number of tokens the turn added.

        Raises:
            ValueError: ``start`` overlaps the previous turn or ``num_tokens`` is negative.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens={num_tokens} must be >= 0")
        if self.spans and start < self.spans[-1][1]:
            raise ValueError(f"turn starting at token {start} overlaps the previous turn {self.spans[-1]}")
        version = output_extra_fields.get(POLICY_VERSION_KEY, started_on(output_extra_fields))
        self.policies.append(str(output_extra_fields.get(POLICY_KEY, CURRENT)))
        self.versions.append(None if version is None else int(version))
        self.spans.append((start, start + num_tokens))

    @property
    def stale_share(self) -> float:
        """Fraction of generated turns from a stale member (0 for a trajectory without turns)."""
        if not self.policies:
            return 0.0
        return sum(p in self.stale_members for p in self.policies) / len(self.policies)

    def token_policies(self, response_length: int) -> list[str | None]:
        """Per response token, the member that generated it (None for observation tokens)."""
        owners: list[str | None] = [None] * response_length
        for policy, (start, end) in zip(self.policies, self.spans, strict=True):
            if end > response_length:
                raise ValueError(f"turn span {(start, end)} exceeds the response length {response_length}")
            owners[start:end] = [policy] * (end - start)
        return owners

    def to_fields(self) -> dict[str, Any]:
        """Plain values (lists, so they survive TransferQueue and JSON dumps), for the episode record."""
        return {
            TURN_POLICIES_KEY: list(self.policies),
            TURN_VERSIONS_KEY: list(self.versions),
            TURN_SPANS_KEY: [list(span) for span in self.spans],
            STALE_TURN_SHARE_KEY: self.stale_share,
        }

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> TurnLog:
        """The log :meth:`to_fields` wrote (its stale share is recomputed from the default stale members)."""
        return cls(policies=[str(p) for p in fields[TURN_POLICIES_KEY]],
                   versions=[None if v is None else int(v) for v in fields[TURN_VERSIONS_KEY]],
                   spans=[(int(a), int(b)) for a, b in fields[TURN_SPANS_KEY]])


def current_policy_versions(versions: Sequence[int | None], policies: Sequence[str]) -> list[int]:
    """The weight versions of the turns the trained policy generated.

    A pool member's turns (a stale copy, another model) are off-policy by design: they stay outside the asynchronous
    pipeline's staleness bound. A turn without a policy record (no pool) counts as the trained policy's.
    """
    return [int(v) for i, v in enumerate(versions) if v is not None and (i >= len(policies) or policies[i] == CURRENT)]


def stale_refresh_due(global_steps: int, refresh_steps: int) -> bool:
    """Whether the stale pool takes the actor's weights after training step ``global_steps``."""
    return global_steps % refresh_steps == 0


def stale_version(global_steps: int, refresh_steps: int) -> int:
    """Weight version the stale pool holds once the actor holds ``global_steps`` (lags by ``< refresh_steps``)."""
    return global_steps - global_steps % refresh_steps


SHARE_BINS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
"""Upper edges of the stale-share bins above 0 (a share of exactly 0 has its own bin)."""


def _share_bin(share: float, edges: Sequence[float]) -> str:
    if share <= 0.0:
        return "0"
    index = min(bisect.bisect_left(edges, share), len(edges) - 1)
    low = 0.0 if index == 0 else edges[index - 1]
    return f"{low:g}-{edges[index]:g}"


def cross_policy_metrics(
    turn_policies: Iterable[Sequence[str]],
    successes: Iterable[bool],
    stale_members: Iterable[str] = OFF_POLICY,
    members: Iterable[str] = (),
    turn_versions: Iterable[Sequence[int | None]] | None = None,
    actor_version: int | None = None,
    turn_spans: Iterable[Sequence[Sequence[int]]] | None = None,
    response_logprobs: Iterable[Sequence[float]] | None = None,
    share_bins: Sequence[float] = SHARE_BINS,
    prefix: str = "cross_policy",
) -> dict[str, float]:
    """Batch metrics of cross-policy sampling.

    Args:
        turn_policies: Per trajectory, the pool member of each generated turn.
        successes: Per trajectory, whether it succeeded.
        stale_members: Members counted as stale.
        members: Members to report even when they served no turn (share 0).
        turn_versions: Per trajectory, the weight version of each generated turn (as ``turn_policies``).
        actor_version: Version the actor held while the batch was generated; with ``turn_versions`` it gives
            each member's version lag.
        turn_spans: Per trajectory, ``[start, end)`` of each generated turn in the response tokens.
        response_logprobs: Per trajectory, the behaviour log-prob of every response token; with ``turn_spans`` it
            gives each member's mean log-prob per generated token.
        share_bins: Upper edges of the stale-share bins (ascending, last 1.0).
        prefix: Metric name prefix.

    Returns:
        ``{prefix}/turn_share/{member}`` (share of all generated turns),
        ``{prefix}/mixed_trajectory_share`` (trajectories with turns from more than one member),
        ``{prefix}/version_lag_mean/{member}`` and ``{prefix}/version_lag_max/{member}`` (``actor_version`` minus
        the turn's version, over the member's turns that report a version),
        ``{prefix}/logprob_mean/{member}`` (mean behaviour log-prob of the member's generated tokens),
        ``{prefix}/success_rate/stale_share_{bin}`` and ``{prefix}/trajectories/stale_share_{bin}`` per non-empty
        bin of the share of stale turns.
    """
    stale = set(stale_members)
    trajectories = [list(p) for p in turn_policies]
    counts: dict[str, int] = dict.fromkeys(members, 0)
    by_bin: dict[str, list[bool]] = {}
    mixed = 0
    for policies, success in zip(trajectories, successes, strict=True):
        for policy in policies:
            counts[policy] = counts.get(policy, 0) + 1
        mixed += len(set(policies)) > 1
        share = sum(p in stale for p in policies) / len(policies) if policies else 0.0
        by_bin.setdefault(_share_bin(share, share_bins), []).append(bool(success))
    lags: dict[str, list[int]] = {}
    if turn_versions is not None and actor_version is not None:
        for policies, versions in zip(trajectories, turn_versions, strict=True):
            for policy, version in zip(policies, versions, strict=True):
                if version is not None:
                    lags.setdefault(policy, []).append(actor_version - version)
    logprobs: dict[str, list[float]] = {}
    if turn_spans is not None and response_logprobs is not None:
        for policies, spans, values in zip(trajectories, turn_spans, response_logprobs, strict=True):
            for policy, (start, end) in zip(policies, spans, strict=True):
                logprobs.setdefault(policy, []).extend(values[start:end])
    total_turns = sum(counts.values())
    metrics = {f"{prefix}/turn_share/{name}": n / total_turns if total_turns else 0.0 for name, n in counts.items()}
    if trajectories:
        metrics[f"{prefix}/mixed_trajectory_share"] = mixed / len(trajectories)
    for name, values in sorted(lags.items()):
        metrics[f"{prefix}/version_lag_mean/{name}"] = sum(values) / len(values)
        metrics[f"{prefix}/version_lag_max/{name}"] = float(max(values))
    for name, values in sorted(logprobs.items()):
        if values:
            metrics[f"{prefix}/logprob_mean/{name}"] = sum(values) / len(values)
    for label, values in sorted(by_bin.items()):
        metrics[f"{prefix}/success_rate/stale_share_{label}"] = sum(values) / len(values)
        metrics[f"{prefix}/trajectories/stale_share_{label}"] = float(len(values))
    return metrics
