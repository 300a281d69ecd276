"""The pure cross-policy module: router draws, training pool, turn bookkeeping, refresh schedule, metrics."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl_verl.core.cross_policy import (
    CURRENT,
    FIXED,
    STALE,
    PolicyRouter,
    TurnLog,
    cross_policy_metrics,
    stale_refresh_due,
    stale_version,
    started_on,
    training_pool,
)

N_DRAWS = 20_000


def _shares(router: PolicyRouter, n_traj: int = 2000, turns: int = 10) -> dict[str, float]:
    counts = dict.fromkeys(router.members, 0)
    for t in range(n_traj):
        for k in range(turns):
            counts[router.choose(f"traj-{t}", k)] += 1
    return {name: c / (n_traj * turns) for name, c in counts.items()}


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
def test_per_turn_distribution_matches_probabilities(ratio):
    shares = _shares(PolicyRouter({CURRENT: 1 - ratio, STALE: ratio}, seed=3))
    # 20k Bernoulli draws: std of the share <= 0.0036, so 0.015 is > 4 sigma.
    assert shares[STALE] == pytest.approx(ratio, abs=0.015)
    assert shares[CURRENT] == pytest.approx(1 - ratio, abs=0.015)


def test_three_members_and_unnormalised_weights():
    shares = _shares(PolicyRouter({"a": 2.0, "b": 1.0, "c": 1.0}, seed=0))
    assert shares == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.25}, abs=0.015)


def test_zero_probability_member_is_never_drawn():
    router = PolicyRouter({CURRENT: 1.0, STALE: 0.0}, seed=1)
    assert {router.choose(f"t{i}", k) for i in range(500) for k in range(5)} == {CURRENT}
    router = PolicyRouter({CURRENT: 0.0, STALE: 1.0}, seed=1)
    assert {router.choose(f"t{i}", k) for i in range(500) for k in range(5)} == {STALE}


def test_draws_are_seeded_and_order_independent():
    keys = [(f"traj-{t}", k) for t in range(200) for k in range(6)]
    a = PolicyRouter({CURRENT: 0.5, STALE: 0.5}, seed=7)
    b = PolicyRouter({CURRENT: 0.5, STALE: 0.5}, seed=7)
    forward = [a.choose(*key) for key in keys]
    backward = [b.choose(*key) for key in reversed(keys)][::-1]
    assert forward == backward  # a draw depends on (seed, trajectory, turn) only, not on call order
    other = [PolicyRouter({CURRENT: 0.5, STALE: 0.5}, seed=8).choose(*key) for key in keys]
    assert other != forward
    # Same seed, different trajectories and turns: both members appear, and single trajectories mix them.
    per_traj = {}
    for (traj, _), member in zip(keys, forward, strict=True):
        per_traj.setdefault(traj, set()).add(member)
    assert sum(len(m) == 2 for m in per_traj.values()) > 150  # 1 - 2 * 0.5**6 ~ 97% of trajectories mix


def test_sticky_mode_is_one_draw_per_trajectory():
    router = PolicyRouter({CURRENT: 0.75, STALE: 0.25}, seed=5, sticky=True)
    per_traj = [{router.choose(f"traj-{t}", k) for k in range(8)} for t in range(N_DRAWS // 8)]
    assert all(len(members) == 1 for members in per_traj)
    stale_share = sum(STALE in m for m in per_traj) / len(per_traj)
    assert stale_share == pytest.approx(0.25, abs=0.04)


@given(st.dictionaries(st.sampled_from("abcd"), st.floats(0.01, 10.0), min_size=1), st.integers(0, 2**32))
def test_choice_is_always_a_pool_member(probabilities, seed):
    router = PolicyRouter(probabilities, seed=seed)
    assert math.isclose(sum(router.probabilities.values()), 1.0)
    assert all(router.choose(str(t), k) in probabilities for t in range(5) for k in range(3))


@pytest.mark.parametrize(
    "probabilities, match",
    [({}, "empty"), ({"a": -0.1, "b": 1.0}, ">= 0"), ({"a": 0.0}, "all zero"), ({"a": float("nan")}, "finite")],
)
def test_router_rejects_bad_pools(probabilities, match):
    with pytest.raises(ValueError, match=match):
        PolicyRouter(probabilities)


def test_training_pool_splits_by_stale_ratio():
    assert training_pool(0.25) == {CURRENT: 0.75, STALE: 0.25}
    assert training_pool(0.25, FIXED) == {CURRENT: 0.75, FIXED: 0.25}


def test_turn_log_keeps_each_turns_policy_version_and_tokens():
    """Mixed turns: the per-token owner map lines up with the behaviour log-probs the loop concatenates."""
    log = TurnLog()
    response_ids, response_mask, logprobs = [], [], []
    turns = [  # (policy, version, generated tokens, log-prob per token of that server, observation tokens)
        (CURRENT, 4, [11, 12, 13], -0.1, [90, 91]),
        (STALE, 2, [14, 15], -0.9, [92]),
        (CURRENT, 4, [16], -0.1, []),
    ]
    for policy, version, tokens, lp, observation in turns:
        log.record({"policy": policy, "policy_version": version}, start=len(response_ids), num_tokens=len(tokens))
        response_ids += tokens
        response_mask += [1] * len(tokens)
        logprobs += [lp] * len(tokens)
        response_ids += observation
        response_mask += [0] * len(observation)
        logprobs += [0.0] * len(observation)

    owners = log.token_policies(len(response_ids))
    assert owners == [CURRENT] * 3 + [None] * 2 + [STALE] * 2 + [None] + [CURRENT]
    # Every loss token has an owner, every observation token none, and the behaviour log-prob is the owner's.
    expected_lp = {CURRENT: -0.1, STALE: -0.9}
    for owner, mask, lp in zip(owners, response_mask, logprobs, strict=True):
        assert (owner is not None) == bool(mask)
        assert lp == (expected_lp[owner] if owner else 0.0)
    fields = log.to_fields()
    assert TurnLog.from_fields(fields).spans == log.spans
    assert fields == {
        "turn_policies": [CURRENT, STALE, CURRENT],
        "turn_versions": [4, 2, 4],
        "turn_spans": [[0, 3], [5, 7], [8, 9]],
        "stale_turn_share": pytest.approx(1 / 3),
    }


def test_turn_log_defaults_and_errors():
    log = TurnLog()
    assert log.stale_share == 0.0
    log.record({"global_steps": 7}, start=0, num_tokens=2)  # a plain verl server: current, version from global_steps
    assert (log.policies, log.versions) == ([CURRENT], [7])
    # A turn aborted at a weight update and resumed on the new weights: the version it started on covers its tokens.
    resumed = {"global_steps": 8, "min_global_steps": 7, "max_global_steps": 8}
    assert started_on(resumed) == 7 and started_on({"global_steps": 8}) == 8 and started_on({}) is None
    log.record(resumed, start=2, num_tokens=1)
    assert log.versions == [7, 7]
    with pytest.raises(ValueError, match="overlaps"):
        log.record({}, start=2, num_tokens=1)
    with pytest.raises(ValueError, match="exceeds the response length"):
        log.token_policies(2)


@pytest.mark.parametrize("k", [1, 2, 5, 25])
def test_stale_pool_lags_by_less_than_k_and_catches_up(k):
    versions = [stale_version(step, k) for step in range(0, 4 * k + 1)]
    lags = [step - v for step, v in enumerate(versions)]
    assert max(lags) == k - 1 and min(lags) == 0
    refreshed = [step for step in range(1, 4 * k + 1) if stale_refresh_due(step, k)]
    assert refreshed == [k, 2 * k, 3 * k, 4 * k]
    assert all(versions[s] == s for s in refreshed)  # caught up right at each refresh


def test_metrics_turn_shares_and_success_by_stale_share():
    turn_policies = [[CURRENT, CURRENT], [CURRENT, STALE], [STALE, STALE], [CURRENT, CURRENT, CURRENT, STALE], []]
    successes = [True, False, True, True, False]
    m = cross_policy_metrics(turn_policies, successes, members=[CURRENT, STALE])
    assert m["cross_policy/turn_share/current"] == pytest.approx(6 / 10)
    assert m["cross_policy/turn_share/stale"] == pytest.approx(4 / 10)
    assert m["cross_policy/mixed_trajectory_share"] == pytest.approx(2 / 5)
    assert m["cross_policy/success_rate/stale_share_0"] == pytest.approx(1 / 2)  # [C,C] ok and [] failed
    assert m["cross_policy/trajectories/stale_share_0"] == 2.0
    assert m["cross_policy/success_rate/stale_share_0-0.25"] == 1.0  # 1/4 stale
    assert m["cross_policy/success_rate/stale_share_0.25-0.5"] == 0.0  # 1/2 stale
    assert m["cross_policy/success_rate/stale_share_0.75-1"] == 1.0
    assert "cross_policy/success_rate/stale_share_0.5-0.75" not in m
    assert cross_policy_metrics([[CURRENT]], [True], members=[CURRENT, STALE])["cross_policy/turn_share/stale"] == 0


def test_metrics_version_lag_per_member():
    m = cross_policy_metrics(
        [[CURRENT, STALE], [STALE, CURRENT, CURRENT]],
        [True, False],
        turn_versions=[[5, 4], [2, 5, None]],
        actor_version=5,
    )
    assert m["cross_policy/version_lag_mean/current"] == 0.0
    assert m["cross_policy/version_lag_mean/stale"] == pytest.approx((1 + 3) / 2)
    assert m["cross_policy/version_lag_max/stale"] == 3.0


def test_fixed_model_turns_count_as_the_second_member_and_have_no_version():
    log = TurnLog()
    log.record({"policy": CURRENT, "policy_version": 3}, start=0, num_tokens=2)
    log.record({"policy": FIXED, "policy_version": None, "global_steps": 0}, start=2, num_tokens=3)
    fields = log.to_fields()
    assert fields["turn_policies"] == [CURRENT, FIXED] and fields["turn_versions"] == [3, None]
    assert fields["stale_turn_share"] == 0.5
    m = cross_policy_metrics(
        [fields["turn_policies"], [FIXED]], [True, False], members=[CURRENT, FIXED],
        turn_versions=[fields["turn_versions"], [None]], actor_version=3,
        turn_spans=[fields["turn_spans"], [[1, 3]]],
        response_logprobs=[[-1.0, -2.0, -7.0, -7.0, -7.0], [0.0, -5.0, -6.0]],
    )
    assert m["cross_policy/turn_share/fixed"] == pytest.approx(2 / 3)
    assert m["cross_policy/success_rate/stale_share_0.25-0.5"] == 1.0
    assert m["cross_policy/success_rate/stale_share_0.75-1"] == 0.0
    # Behaviour log-prob per member over its own tokens only; no version lag for a member without versions.
    assert m["cross_policy/logprob_mean/current"] == pytest.approx(-1.5)
    assert m["cross_policy/logprob_mean/fixed"] == pytest.approx((3 * -7.0 - 5.0 - 6.0) / 5)
    assert m["cross_policy/version_lag_max/current"] == 0.0
    assert not [key for key in m if "version" in key and key.endswith(FIXED)]
    assert not [key for key in cross_policy_metrics([[CURRENT]], [True]) if "logprob" in key]
